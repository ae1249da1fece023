#include "runtime/job/job_config.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/errors.h"
#include "runtime/job/job_limits.h"

namespace pipetrain::job {
namespace {

bool IsTokenModel(const std::string& name) { return name == "gpt"; }

// The layer names of a built-in model, without building it; nullopt for a TorchScript model
// (known once loaded) or an unknown model or depth (reported by the model's own check).
std::optional<std::vector<std::string>> KnownLayerNames(const model::ModelConfig& m) {
  absl::StatusOr<std::vector<std::string>> names = model::BuiltinLayerNames(m);
  if (!names.ok()) return std::nullopt;
  return *std::move(names);
}

// The model's and the optimizer's own checks say "model.d_model must be > 0" or "unknown
// model 'x'"; a job's violations each start with their field path and a colon.
std::string WithFieldPath(std::string v, const std::string& name_path) {
  if (absl::StartsWith(v, "unknown ")) return absl::StrCat(name_path, ": ", v);
  const size_t space = v.find(' ');
  if (space != std::string::npos && v.compare(space, 6, " must ") == 0) v.insert(space, ":");
  return v;
}

}  // namespace

absl::StatusOr<RecomputeConfig> ParseRecompute(const std::string& text) {
  RecomputeConfig config;
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "none" || lower.empty()) return config;
  if (lower == "all") {
    config.mode = RecomputeConfig::Mode::kAll;
    return config;
  }
  std::vector<std::string> parts = absl::StrSplit(lower, absl::MaxSplits(':', 1));
  if (parts.size() == 2 && (parts[0] == "stages" || parts[0] == "layers")) {
    config.mode = parts[0] == "stages" ? RecomputeConfig::Mode::kStages
                                       : RecomputeConfig::Mode::kLayers;
    for (absl::string_view item : absl::StrSplit(parts[1], ',', absl::SkipWhitespace())) {
      int index = 0;
      if (!absl::SimpleAtoi(item, &index) || index < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("recompute: bad index '", item, "' in '", text, "'"));
      }
      config.indices.push_back(index);
    }
    if (!config.indices.empty()) return config;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "recompute: expected none, all, stages:I,J,... or layers:I,J,..., got '", text, "'"));
}

std::string FormatRecompute(const RecomputeConfig& c) {
  switch (c.mode) {
    case RecomputeConfig::Mode::kNone: return "none";
    case RecomputeConfig::Mode::kAll: return "all";
    case RecomputeConfig::Mode::kStages: return absl::StrCat("stages:", absl::StrJoin(c.indices, ","));
    case RecomputeConfig::Mode::kLayers: return absl::StrCat("layers:", absl::StrJoin(c.indices, ","));
  }
  return "none";
}

int VirtualStages(const JobConfig& config) {
  if (!schedule::HoldsChunks(config.schedule)) return std::max(1, config.virtual_stages);
  return config.virtual_stages > 0 ? config.virtual_stages
                                   : schedule::DefaultVirtualStages(config.schedule);
}

int PipelineStages(const JobConfig& config) {
  return config.stage_ranges.empty()
             ? config.stages
             : static_cast<int>(config.stage_ranges.size()) / VirtualStages(config);
}

schedule::ScheduleParams ScheduleParamsOf(const JobConfig& config, int steps) {
  schedule::ScheduleParams params{config.schedule, config.stages, config.micro_batches, steps};
  params.virtual_stages = VirtualStages(config);
  return params;
}

model::PipelineLayout PipelineLayoutOf(const JobConfig& config) {
  model::PipelineLayout layout;
  layout.stages = PipelineStages(config);
  layout.replicas = config.replicas;
  layout.micro_batches = config.micro_batches;
  layout.micro_batch_size = config.micro_batch_size;
  for (const model::LayerRange& r : config.stage_ranges) layout.stage_layers.emplace_back(r.begin, r.end);
  return layout;
}

absl::StatusOr<Precision> ParsePrecision(const std::string& text) {
  if (text == "float64" || text == "double") return Precision::kFloat64;
  if (text == "float32" || text == "float") return Precision::kFloat32;
  if (text == "bfloat16" || text == "bf16") return Precision::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("expected float32, float64 or bfloat16, got '", text, "'"));
}

const char* PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFloat32: return "float32";
    case Precision::kFloat64: return "float64";
    case Precision::kBFloat16: return "bfloat16";
  }
  return "float32";
}

std::string EffectiveDataKind(const JobConfig& config) {
  if (!config.data.kind.empty()) return config.data.kind;
  const std::string& m = config.model.name;
  return (m == "mlp" || m == "cnn" || m == "vgg") ? "classification" : "synthetic";
}

std::string CommitStepsRefusal(const JobConfig& c) {
  if (schedule::WeightsOf(c.schedule) == schedule::WeightPolicy::kStashed) {
    return "pipedream's updates follow its micro-batches' weight versions, which no one step "
           "of the survivors holds";
  }
  return "";
}

absl::Status ValidateJobConfig(const JobConfig& c) {
  std::vector<std::string> errors;
  model::ModelConfig model = c.model;  // sizes that come from the data are not checked here
  const absl::Status model_status = model::ValidateModelConfig(model);
  for (const std::string& v : ViolationsOf(model_status)) {
    errors.push_back(WithFieldPath(v, "model.name"));
  }
  for (const std::string& v : ViolationsOf(weights::ValidateOptimizerConfig(c.optimizer))) {
    errors.push_back(WithFieldPath(v, "optimizer.name"));
  }

  const std::string kind = EffectiveDataKind(c);
  const bool token_data = kind == "synthetic" || kind == "bytes" || kind == "uint16";
  if (!token_data && kind != "classification") {
    errors.push_back(absl::StrCat("data.kind: unknown '", kind,
                                  "' (known: synthetic, bytes, uint16, classification)"));
  } else {
    if (IsTokenModel(c.model.name) && !token_data) {
      errors.push_back(absl::StrCat("data.kind: model gpt needs token data (synthetic, bytes, "
                                    "uint16), got ", kind));
    }
    if ((c.model.name == "mlp" || c.model.name == "cnn" || c.model.name == "vgg") && token_data) {
      errors.push_back(absl::StrCat("data.kind: model ", c.model.name,
                                    " needs feature data (classification), got ", kind));
    }
  }
  if ((kind == "bytes" || kind == "uint16") && c.data.path.empty()) {
    errors.push_back(absl::StrCat("data.path: required for data.kind ", kind));
  }
  if (token_data && c.data.seq_len < 1) {
    errors.push_back(absl::StrCat("data.seq_len: must be >= 1, got ", c.data.seq_len));
  }
  if (kind == "synthetic") {
    if (c.data.vocab < 2) errors.push_back(absl::StrCat("data.vocab: must be >= 2, got ", c.data.vocab));
    if (c.data.branching < 1 || c.data.branching > c.data.vocab) {
      errors.push_back(absl::StrCat("data.branching: must be in [1, vocab], got ", c.data.branching));
    }
    if (c.data.num_tokens <= c.data.seq_len) {
      errors.push_back(absl::StrCat("data.num_tokens: must exceed data.seq_len, got ",
                                    c.data.num_tokens));
    }
  }
  if (kind == "uint16" && c.data.vocab < 0) {
    errors.push_back("data.vocab: must be >= 0 (0 infers it) for uint16 data");
  }
  if (kind == "classification" && c.data.num_samples < 1) {
    errors.push_back(absl::StrCat("data.num_samples: must be >= 1, got ", c.data.num_samples));
  }

  if (c.device != "cpu" && c.device != "cuda") {
    errors.push_back(absl::StrCat("device: expected cpu or cuda, got '", c.device, "'"));
  }
  if (c.stages < 1) errors.push_back(absl::StrCat("stages: must be >= 1, got ", c.stages));
  if (c.replicas < 1) errors.push_back(absl::StrCat("replicas: must be >= 1, got ", c.replicas));
  if (c.bucket_kib < 1) errors.push_back(absl::StrCat("bucket_kib: must be >= 1, got ", c.bucket_kib));
  if (c.planner != "2bw" && c.planner != "pipedream" && c.planner != "hippie") {
    errors.push_back(absl::StrCat("planner: unknown '", c.planner,
                                  "' (one of: 2bw, pipedream, hippie)"));
  }
  if (c.vertical_sync && schedule::WeightsOf(c.schedule) != schedule::WeightPolicy::kStashed) {
    errors.push_back(absl::StrCat(
        "vertical_sync: only pipedream runs micro-batches on weight versions of their own; "
        "schedule is ", std::string(schedule::ScheduleKindName(c.schedule))));
  }
  if (c.auto_stages && !c.stage_ranges.empty()) {
    errors.push_back("stages: auto and explicit layer ranges exclude each other");
  }
  const int chunks = VirtualStages(c);
  const int model_stages = c.stages * chunks;  // of the pipeline: v on each of its p ranks
  if (!c.stage_ranges.empty() && static_cast<int>(c.stage_ranges.size()) != model_stages) {
    errors.push_back(
        chunks == 1 ? absl::StrCat("stages: ", c.stage_ranges.size(), " layer ranges given for ",
                                   c.stages, " stages")
                    : absl::StrCat("stages: ", c.stage_ranges.size(), " layer ranges given for ",
                                   c.stages, " ranks of ", chunks,
                                   " model stages (virtual_stages): ",
                              model_stages, " are needed"));
  }
  // (its range is job_limits.cc's)
  if (c.eval.every > 0 && c.eval.split == 0) {
    errors.push_back("eval.split: must be > 0 when eval.every is set (the samples evaluated "
                     "are held out of training)");
  }
  if (c.commit_steps) {
    if (std::string why = CommitStepsRefusal(c); !why.empty()) {
      errors.push_back(absl::StrCat("commit_steps: ", why));
    }
  }
  if (c.auto_stages && !schedule::TraitsOf(c.schedule).planned_by_auto) {
    errors.push_back(absl::StrCat(
        "stages: auto plans gpipe, 1f1b and 2bw layouts; schedule ",
        std::string(schedule::ScheduleKindName(c.schedule)), " needs its stages given"));
  }
  if (c.micro_batch_size < 1) {
    errors.push_back(absl::StrCat("microbatch_size: must be >= 1, got ", c.micro_batch_size));
  }
  if (c.steps < 1) errors.push_back(absl::StrCat("steps: must be >= 1, got ", c.steps));
  const schedule::ScheduleParams params = ScheduleParamsOf(c, 1);
  if (c.micro_batches < 1) {
    errors.push_back(absl::StrCat("microbatches: must be >= 1, got ", c.micro_batches));
  } else if (c.stages >= 1 && !c.auto_stages) {  // a planned layout is checked once planned
    if (absl::Status s = schedule::ValidateScheduleParams(params); !s.ok()) {
      for (const std::string& v : ViolationsOf(s)) errors.push_back(absl::StrCat("schedule: ", v));
    }
  }
  // The partition against the model's layers, named, when they are known without building
  // it (built-in models); the runner checks it again (a TorchScript model's only there).
  const std::optional<std::vector<std::string>> layers = KnownLayerNames(c.model);
  if (c.auto_stages) {
    // The planner chooses stages, schedule and recomputation.
  } else if (layers && !c.stage_ranges.empty()) {
    const absl::Status partition = model::ValidatePartition(c.stage_ranges, *layers);
    for (std::string v : ViolationsOf(partition)) {
      // The first one starts "invalid partition 0:2,3:5: ".
      if (absl::StartsWith(v, "invalid partition ")) v = v.substr(v.find(": ") + 2);
      errors.push_back(absl::StrCat("stages: ", v));
    }
  } else if (layers && c.stage_ranges.empty() && model_stages > static_cast<int>(layers->size())) {
    errors.push_back(absl::StrCat("stages: ", model_stages,
                                  chunks == 1 ? std::string(" stages")
                                              : absl::StrCat(" model stages (", c.stages, " x ",
                                                             chunks, " virtual_stages)"),
                                  " for a model of ", layers->size(), " layers (",
                                  absl::StrJoin(*layers, ", "),
                                  "): each stage needs at least one layer"));
  }
  if (c.recompute.mode == RecomputeConfig::Mode::kStages && !c.auto_stages) {
    for (int s : c.recompute.indices) {
      if (s >= model_stages) {
        errors.push_back(absl::StrCat("recompute: stage ", s, " does not exist (", model_stages,
                                      chunks == 1 ? " stages)" : " model stages)"));
      }
    }
  }
  if (c.recompute.mode == RecomputeConfig::Mode::kLayers && layers) {
    for (int i : c.recompute.indices) {
      if (i >= static_cast<int>(layers->size())) {
        errors.push_back(absl::StrCat("recompute: layer ", i, " does not exist (the model has ",
                                      layers->size(), " layers)"));
      }
    }
  }
  if (c.threads_per_stage < 0) {
    errors.push_back(absl::StrCat("threads_per_stage: must be >= 0, got ", c.threads_per_stage));
  }
  if (c.checkpoint.dir.empty() && (c.checkpoint.every > 0 || c.resume_from == "latest")) {
    errors.push_back("checkpoint.dir: must not be empty with checkpoint.every or "
                     "resume_from: latest");
  }
  if (!(c.recv_timeout_s > 0)) {
    errors.push_back(absl::StrCat("timeout_s: must be > 0, got ", c.recv_timeout_s));
  }
  // The limits table: a field's bounds, unless a check above already named that field.
  for (std::string& v : LimitViolations(c)) {
    const std::string path = v.substr(0, v.find_first_of(":[ "));
    const bool named = std::any_of(errors.begin(), errors.end(), [&](const std::string& e) {
      return absl::StartsWith(e, path) &&
             (e.size() == path.size() || absl::string_view(":[ (/").find(e[path.size()]) !=
                                             absl::string_view::npos);
    });
    if (!named) errors.push_back(std::move(v));
  }
  return InvalidArgumentList("invalid job", errors);
}

std::string JobConfigToJson(const JobConfig& c) {
  nlohmann::ordered_json j;
  j["name"] = c.name;
  auto& m = j["model"];
  m["name"] = c.model.name;
  m["d_model"] = c.model.d_model;
  m["n_heads"] = c.model.n_heads;
  m["n_layers"] = c.model.n_layers;
  m["dropout"] = c.model.dropout;
  m["tie_embeddings"] = c.model.tie_embeddings;
  m["tie"] = c.model.tie;
  m["hidden"] = c.model.hidden;
  m["hidden_layers"] = c.model.hidden_layers;
  m["input_dim"] = c.model.input_dim;
  m["image_shape"] = c.model.image_shape;
  m["num_classes"] = c.model.num_classes;
  m["path"] = c.model.torchscript_path;
  auto& d = j["data"];
  d["kind"] = c.data.kind;
  d["path"] = c.data.path;
  d["seq_len"] = c.data.seq_len;
  d["vocab"] = c.data.vocab;
  d["branching"] = c.data.branching;
  d["num_tokens"] = c.data.num_tokens;
  d["num_samples"] = c.data.num_samples;
  d["seed"] = c.data.seed;
  j["schedule"] = std::string(schedule::ScheduleKindName(c.schedule));
  j["stages"] = c.stages;
  j["virtual_stages"] = c.virtual_stages;
  j["vertical_sync"] = c.vertical_sync;
  j["stage_ranges"] = nlohmann::ordered_json::array();
  for (const model::LayerRange& r : c.stage_ranges) j["stage_ranges"].push_back({r.begin, r.end});
  j["replicas"] = c.replicas;
  j["overlap_allreduce"] = c.overlap_allreduce;
  j["bucket_kib"] = c.bucket_kib;
  j["microbatches"] = c.micro_batches;
  j["microbatch_size"] = c.micro_batch_size;
  j["steps"] = c.steps;
  auto& o = j["optimizer"];
  o["name"] = c.optimizer.name;
  o["lr"] = c.optimizer.lr;
  o["weight_decay"] = c.optimizer.weight_decay;
  o["momentum"] = c.optimizer.momentum;
  o["beta1"] = c.optimizer.beta1;
  o["beta2"] = c.optimizer.beta2;
  o["eps"] = c.optimizer.eps;
  o["clip_grad_norm"] = c.optimizer.clip_grad_norm;
  o["no_decay"] = nlohmann::ordered_json::array();
  for (model::ParameterKind kind : model::kAllParameterKinds) {
    if (c.optimizer.no_decay & model::KindBit(kind)) {
      o["no_decay"].push_back(std::string(model::ParameterKindName(kind)));
    }
  }
  auto& lr = o["schedule"];
  lr["warmup_steps"] = c.optimizer.schedule.warmup_steps;
  lr["decay"] = std::string(weights::LrDecayName(c.optimizer.schedule.decay));
  lr["decay_steps"] = c.optimizer.schedule.decay_steps;
  lr["min_lr"] = c.optimizer.schedule.min_lr;
  j["recompute"] = FormatRecompute(c.recompute);
  j["seed"] = c.seed;
  j["dtype"] = PrecisionName(c.precision);
  j["device"] = c.device;
  j["threads_per_stage"] = c.threads_per_stage;
  j["timeout_s"] = c.recv_timeout_s;
  j["weights_dir"] = c.weights_dir;
  auto& e = j["eval"];
  e["every"] = c.eval.every;
  e["batches"] = c.eval.batches;
  e["split"] = c.eval.split;
  auto& k = j["checkpoint"];
  k["dir"] = c.checkpoint.dir;
  k["every"] = c.checkpoint.every;
  k["keep"] = c.checkpoint.keep;
  j["resume_from"] = c.resume_from;
  j["max_restarts"] = c.max_restarts;
  j["nonfinite_limit"] = c.nonfinite_limit;
  j["auto_stages"] = c.auto_stages;
  j["planner"] = c.planner;
  // Invalid UTF-8 (a name ValidateJobConfig refuses) is shown replaced, never thrown on.
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace pipetrain::job
