#include "runtime/job/job_spec.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
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
    config.mode =
        parts[0] == "stages" ? RecomputeConfig::Mode::kStages : RecomputeConfig::Mode::kLayers;
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
    case RecomputeConfig::Mode::kStages:
      return absl::StrCat("stages:", absl::StrJoin(c.indices, ","));
    case RecomputeConfig::Mode::kLayers:
      return absl::StrCat("layers:", absl::StrJoin(c.indices, ","));
  }
  return "none";
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

namespace {

// A view's value, or std::invalid_argument for a spec ValidateJob refuses.
template <typename T>
T Accepted(absl::StatusOr<T> value, const char* field) {
  if (!value.ok()) {
    throw std::invalid_argument(
        absl::StrCat(field, ": ", value.status().message(), " (a spec ValidateJob refuses)"));
  }
  return *std::move(value);
}

absl::StatusOr<weights::OptimizerConfig> ParseOptimizer(const v1::OptimizerSpec& o,
                                                        std::vector<std::string>* errors) {
  weights::OptimizerConfig c;
  c.name = o.name();
  c.lr = o.lr();
  c.weight_decay = o.weight_decay();
  c.momentum = o.momentum();
  c.beta1 = o.beta1();
  c.beta2 = o.beta2();
  c.eps = o.eps();
  for (const std::string& name : o.no_decay()) {
    absl::StatusOr<model::ParameterKind> kind = model::ParseParameterKind(name);
    if (kind.ok()) {
      c.no_decay |= model::KindBit(*kind);
    } else {
      errors->push_back(absl::StrCat("optimizer.no_decay: ", kind.status().message()));
    }
  }
  const v1::LrScheduleSpec& lr = o.schedule();
  c.schedule.warmup_steps = lr.warmup_steps();
  absl::StatusOr<weights::LrDecay> decay = weights::ParseLrDecay(lr.decay());
  if (decay.ok()) {
    c.schedule.decay = *decay;
  } else {
    errors->push_back(absl::StrCat("optimizer.schedule.decay: ", decay.status().message()));
  }
  c.schedule.decay_steps = lr.decay_steps();
  c.schedule.min_lr = lr.min_lr();
  if (errors->empty()) return c;
  return absl::InvalidArgumentError(absl::StrJoin(*errors, "; "));
}

}  // namespace

schedule::ScheduleKind ScheduleOf(const JobSpec& spec) {
  return Accepted(schedule::ParseScheduleKind(spec.schedule()), "schedule");
}

Precision PrecisionOf(const JobSpec& spec) {
  return Accepted(ParsePrecision(spec.dtype()), "dtype");
}

RecomputeConfig RecomputeOf(const JobSpec& spec) {
  return Accepted(ParseRecompute(spec.recompute()), "recompute");
}

model::ModelConfig ModelConfigOf(const JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  model::ModelConfig c;
  c.name = m.name();
  c.d_model = m.d_model();
  c.n_heads = m.n_heads();
  c.n_layers = m.n_layers();
  c.dropout = m.dropout();
  c.tie_embeddings = m.tie_embeddings();
  c.tie.assign(m.tie().begin(), m.tie().end());
  c.hidden = m.hidden();
  c.hidden_layers = m.hidden_layers();
  c.input_dim = m.input_dim();
  if (m.image_shape_size() > 0)
    c.image_shape.assign(m.image_shape().begin(), m.image_shape().end());
  c.num_classes = m.num_classes();
  c.torchscript_path = m.path();
  return c;
}

weights::OptimizerConfig OptimizerConfigOf(const JobSpec& spec) {
  std::vector<std::string> errors;
  return Accepted(ParseOptimizer(spec.optimizer(), &errors), "optimizer");
}

std::vector<model::LayerRange> StageRangesOf(const JobSpec& spec) {
  std::vector<model::LayerRange> ranges;
  ranges.reserve(spec.stage_ranges_size());
  for (const v1::LayerRange& r : spec.stage_ranges()) ranges.push_back({r.begin(), r.end()});
  return ranges;
}

std::string DataKindOf(const JobSpec& spec) {
  if (!spec.data().kind().empty()) return spec.data().kind();
  const std::string& m = spec.model().name();
  return (m == "mlp" || m == "cnn" || m == "vgg") ? "classification" : "synthetic";
}

void SetSchedule(JobSpec& spec, schedule::ScheduleKind kind) {
  spec.set_schedule(std::string(schedule::ScheduleKindName(kind)));
}

void SetPrecision(JobSpec& spec, Precision precision) { spec.set_dtype(PrecisionName(precision)); }

void SetRecompute(JobSpec& spec, const RecomputeConfig& recompute) {
  spec.set_recompute(FormatRecompute(recompute));
}

void SetStageRanges(JobSpec& spec, const std::vector<model::LayerRange>& ranges) {
  spec.clear_stage_ranges();
  for (const model::LayerRange& r : ranges) {
    v1::LayerRange* range = spec.add_stage_ranges();
    range->set_begin(r.begin);
    range->set_end(r.end);
  }
}

namespace {

// v for `kind` (VirtualStages with the kind given: ValidateJob reads an unknown name as the
// default schedule's so that it can go on checking).
int VirtualStagesFor(const JobSpec& spec, schedule::ScheduleKind kind) {
  if (!schedule::HoldsChunks(kind)) return std::max(1, spec.virtual_stages());
  return spec.virtual_stages() > 0 ? spec.virtual_stages() : schedule::DefaultVirtualStages(kind);
}

int PipelineStagesFor(const JobSpec& spec, schedule::ScheduleKind kind) {
  if (spec.has_stages() || spec.stage_ranges().empty()) return spec.stages();
  return spec.stage_ranges_size() / VirtualStagesFor(spec, kind);
}

}  // namespace

int VirtualStages(const JobSpec& spec) { return VirtualStagesFor(spec, ScheduleOf(spec)); }

int PipelineStages(const JobSpec& spec) { return PipelineStagesFor(spec, ScheduleOf(spec)); }

schedule::ScheduleParams ScheduleParamsOf(const JobSpec& spec, int steps) {
  schedule::ScheduleParams params{ScheduleOf(spec), PipelineStages(spec), spec.microbatches(),
                                  steps};
  params.virtual_stages = VirtualStages(spec);
  return params;
}

model::PipelineLayout PipelineLayoutOf(const JobSpec& spec) {
  model::PipelineLayout layout;
  layout.stages = PipelineStages(spec);
  layout.replicas = spec.replicas();
  layout.micro_batches = spec.microbatches();
  layout.micro_batch_size = spec.microbatch_size();
  for (const v1::LayerRange& r : spec.stage_ranges())
    layout.stage_layers.emplace_back(r.begin(), r.end());
  return layout;
}

std::string CommitStepsRefusal(const JobSpec& spec) {
  if (schedule::WeightsOf(ScheduleOf(spec)) == schedule::WeightPolicy::kStashed) {
    return "pipedream's updates follow its micro-batches' weight versions, which no one step "
           "of the survivors holds";
  }
  return "";
}

absl::Status ValidateJob(const JobSpec& c) {
  std::vector<std::string> errors;
  // The names first; where one does not parse, the checks after it read the default's.
  std::vector<std::string> optimizer_errors;
  absl::StatusOr<weights::OptimizerConfig> optimizer =
      ParseOptimizer(c.optimizer(), &optimizer_errors);
  errors.insert(errors.end(), optimizer_errors.begin(), optimizer_errors.end());
  schedule::ScheduleKind kind = ScheduleOf(JobSpec::default_instance());
  if (auto parsed = schedule::ParseScheduleKind(c.schedule()); parsed.ok()) {
    kind = *parsed;
  } else {
    // One violation: its list of names must not read as more ("; " separates them).
    errors.push_back(
        absl::StrCat("schedule: ", absl::StrReplaceAll(parsed.status().message(), {{"; ", ", "}})));
  }
  RecomputeConfig recompute;
  if (auto parsed = ParseRecompute(c.recompute()); parsed.ok()) {
    recompute = *parsed;
  } else {
    errors.push_back(std::string(parsed.status().message()));
  }
  if (auto parsed = ParsePrecision(c.dtype()); !parsed.ok()) {
    errors.push_back(absl::StrCat("dtype: ", parsed.status().message()));
  }
  if (c.has_weights_dir() && c.weights_dir().empty()) {
    errors.push_back("weights_dir: must not be empty when set");
  }

  const model::ModelConfig model = ModelConfigOf(c);  // the data's sizes are not checked here
  for (const std::string& v : ViolationsOf(model::ValidateModelConfig(model))) {
    errors.push_back(WithFieldPath(v, "model.name"));
  }
  if (optimizer.ok()) {
    for (const std::string& v : ViolationsOf(weights::ValidateOptimizerConfig(*optimizer))) {
      errors.push_back(WithFieldPath(v, "optimizer.name"));
    }
  }

  const v1::DataSpec& data = c.data();
  const std::string data_kind = DataKindOf(c);
  const bool token_data = data_kind == "synthetic" || data_kind == "bytes" || data_kind == "uint16";
  const std::string& model_name = c.model().name();
  if (!token_data && data_kind != "classification") {
    errors.push_back(absl::StrCat("data.kind: unknown '", data_kind,
                                  "' (known: synthetic, bytes, uint16, classification)"));
  } else {
    if (IsTokenModel(model_name) && !token_data) {
      errors.push_back(
          absl::StrCat("data.kind: model gpt needs token data (synthetic, bytes, "
                       "uint16), got ",
                       data_kind));
    }
    if ((model_name == "mlp" || model_name == "cnn" || model_name == "vgg") && token_data) {
      errors.push_back(absl::StrCat("data.kind: model ", model_name,
                                    " needs feature data (classification), got ", data_kind));
    }
  }
  if ((data_kind == "bytes" || data_kind == "uint16") && data.path().empty()) {
    errors.push_back(absl::StrCat("data.path: required for data.kind ", data_kind));
  }
  if (token_data && data.seq_len() < 1) {
    errors.push_back(absl::StrCat("data.seq_len: must be >= 1, got ", data.seq_len()));
  }
  if (data_kind == "synthetic") {
    if (data.vocab() < 2) {
      errors.push_back(absl::StrCat("data.vocab: must be >= 2, got ", data.vocab()));
    }
    if (data.branching() < 1 || data.branching() > data.vocab()) {
      errors.push_back(
          absl::StrCat("data.branching: must be in [1, vocab], got ", data.branching()));
    }
    if (data.num_tokens() <= data.seq_len()) {
      errors.push_back(
          absl::StrCat("data.num_tokens: must exceed data.seq_len, got ", data.num_tokens()));
    }
  }
  if (data_kind == "uint16" && data.vocab() < 0) {
    errors.push_back("data.vocab: must be >= 0 (0 infers it) for uint16 data");
  }
  if (data_kind == "classification" && data.num_samples() < 1) {
    errors.push_back(absl::StrCat("data.num_samples: must be >= 1, got ", data.num_samples()));
  }

  if (c.device() != "cpu" && c.device() != "cuda") {
    errors.push_back(absl::StrCat("device: expected cpu or cuda, got '", c.device(), "'"));
  }
  const int stages = PipelineStagesFor(c, kind);
  if (stages < 1) errors.push_back(absl::StrCat("stages: must be >= 1, got ", stages));
  if (c.replicas() < 1)
    errors.push_back(absl::StrCat("replicas: must be >= 1, got ", c.replicas()));
  if (c.bucket_kib() < 1) {
    errors.push_back(absl::StrCat("bucket_kib: must be >= 1, got ", c.bucket_kib()));
  }
  if (c.planner() != "2bw" && c.planner() != "pipedream" && c.planner() != "hippie") {
    errors.push_back(
        absl::StrCat("planner: unknown '", c.planner(), "' (one of: 2bw, pipedream, hippie)"));
  }
  if (c.vertical_sync() && schedule::WeightsOf(kind) != schedule::WeightPolicy::kStashed) {
    errors.push_back(absl::StrCat(
        "vertical_sync: only pipedream runs micro-batches on weight versions of their own; "
        "schedule is ",
        std::string(schedule::ScheduleKindName(kind))));
  }
  if (c.auto_stages() && !c.stage_ranges().empty()) {
    errors.push_back("stages: auto and explicit layer ranges exclude each other");
  }
  const int chunks = VirtualStagesFor(c, kind);
  const int model_stages = stages * chunks;  // of the pipeline: v on each of its p ranks
  if (!c.stage_ranges().empty() && c.stage_ranges_size() != model_stages) {
    errors.push_back(chunks == 1
                         ? absl::StrCat("stages: ", c.stage_ranges_size(),
                                        " layer ranges given for ", stages, " stages")
                         : absl::StrCat("stages: ", c.stage_ranges_size(),
                                        " layer ranges given for ", stages, " ranks of ", chunks,
                                        " model stages (virtual_stages): ", model_stages,
                                        " are needed"));
  }
  if (c.eval().every() > 0 && c.eval().split() == 0) {
    errors.push_back(
        "eval.split: must be > 0 when eval.every is set (the samples evaluated "
        "are held out of training)");
  }
  if (c.auto_stages() && !schedule::TraitsOf(kind).planned_by_auto) {
    errors.push_back(absl::StrCat("stages: auto plans gpipe, 1f1b and 2bw layouts; schedule ",
                                  std::string(schedule::ScheduleKindName(kind)),
                                  " needs its stages given"));
  }
  if (c.microbatch_size() < 1) {
    errors.push_back(absl::StrCat("microbatch_size: must be >= 1, got ", c.microbatch_size()));
  }
  if (c.steps() < 1) errors.push_back(absl::StrCat("steps: must be >= 1, got ", c.steps()));
  schedule::ScheduleParams params{kind, stages, c.microbatches(), 1};
  params.virtual_stages = chunks;
  if (c.microbatches() < 1) {
    errors.push_back(absl::StrCat("microbatches: must be >= 1, got ", c.microbatches()));
  } else if (stages >= 1 && !c.auto_stages()) {  // a planned layout is checked once planned
    if (absl::Status s = schedule::ValidateScheduleParams(params); !s.ok()) {
      for (const std::string& v : ViolationsOf(s)) errors.push_back(absl::StrCat("schedule: ", v));
    }
  }
  // The partition against the model's layers, named, when they are known without building
  // it (built-in models); the runner checks it again (a TorchScript model's only there).
  const std::optional<std::vector<std::string>> layers = KnownLayerNames(model);
  if (c.auto_stages()) {
    // The planner chooses stages, schedule and recomputation.
  } else if (layers && !c.stage_ranges().empty()) {
    const absl::Status partition = model::ValidatePartition(StageRangesOf(c), *layers);
    for (std::string v : ViolationsOf(partition)) {
      // The first one starts "invalid partition 0:2,3:5: ".
      if (absl::StartsWith(v, "invalid partition ")) v = v.substr(v.find(": ") + 2);
      errors.push_back(absl::StrCat("stages: ", v));
    }
  } else if (layers && c.stage_ranges().empty() &&
             model_stages > static_cast<int>(layers->size())) {
    errors.push_back(absl::StrCat(
        "stages: ", model_stages,
        chunks == 1 ? std::string(" stages")
                    : absl::StrCat(" model stages (", stages, " x ", chunks, " virtual_stages)"),
        " for a model of ", layers->size(), " layers (", absl::StrJoin(*layers, ", "),
        "): each stage needs at least one layer"));
  }
  if (recompute.mode == RecomputeConfig::Mode::kStages && !c.auto_stages()) {
    for (int s : recompute.indices) {
      if (s >= model_stages) {
        errors.push_back(absl::StrCat("recompute: stage ", s, " does not exist (", model_stages,
                                      chunks == 1 ? " stages)" : " model stages)"));
      }
    }
  }
  if (recompute.mode == RecomputeConfig::Mode::kLayers && layers) {
    for (int i : recompute.indices) {
      if (i >= static_cast<int>(layers->size())) {
        errors.push_back(absl::StrCat("recompute: layer ", i, " does not exist (the model has ",
                                      layers->size(), " layers)"));
      }
    }
  }
  if (c.threads_per_stage() < 0) {
    errors.push_back(absl::StrCat("threads_per_stage: must be >= 0, got ", c.threads_per_stage()));
  }
  if (c.checkpoint().dir().empty() && (c.checkpoint().every() > 0 || c.resume_from() == "latest")) {
    errors.push_back(
        "checkpoint.dir: must not be empty with checkpoint.every or "
        "resume_from: latest");
  }
  if (!(c.timeout_s() > 0)) {
    errors.push_back(absl::StrCat("timeout_s: must be > 0, got ", c.timeout_s()));
  }
  // The limits: a field's bounds, unless a check above already named that field.
  for (std::string& v : LimitViolations(c, stages)) {
    const std::string path = v.substr(0, v.find_first_of(":[ "));
    const bool named = std::any_of(errors.begin(), errors.end(), [&](const std::string& e) {
      return absl::StartsWith(e, path) &&
             (e.size() == path.size() ||
              absl::string_view(":[ (/").find(e[path.size()]) != absl::string_view::npos);
    });
    if (!named) errors.push_back(std::move(v));
  }
  return InvalidArgumentList("invalid job", errors);
}

absl::StatusOr<JobSpec> Validated(JobSpec spec) {
  if (absl::Status s = ValidateJob(spec); !s.ok()) return s;
  return spec;
}

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Every unset optional field of `msg` set to its default, its messages' too.
void SetDefaults(Message* msg) {
  const google::protobuf::Descriptor* d = msg->GetDescriptor();
  const google::protobuf::Reflection* r = msg->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      SetDefaults(r->MutableMessage(msg, f));
      continue;
    }
    if (r->HasField(*msg, f)) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(msg, f, r->GetInt32(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(msg, f, r->GetInt64(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(msg, f, r->GetUInt32(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(msg, f, r->GetUInt64(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(msg, f, r->GetDouble(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(msg, f, r->GetFloat(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(msg, f, r->GetBool(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(msg, f, r->GetString(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_ENUM: r->SetEnum(msg, f, r->GetEnum(*msg, f)); break;
      case FieldDescriptor::CPPTYPE_MESSAGE: break;
    }
  }
}

// Invalid UTF-8 in a string (a name or path ValidateJob refuses) replaced, so that the JSON
// printer, which refuses it, prints the rest.
void ReplaceInvalidUtf8(Message* msg) {
  const google::protobuf::Descriptor* d = msg->GetDescriptor();
  const google::protobuf::Reflection* r = msg->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      if (r->HasField(*msg, f)) ReplaceInvalidUtf8(r->MutableMessage(msg, f));
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !f->is_repeated() &&
               r->HasField(*msg, f)) {
      const std::string v = r->GetString(*msg, f);
      std::string valid;
      const nlohmann::json j = v;
      valid =
          nlohmann::json::parse(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
              .get<std::string>();
      if (valid != v) r->SetString(msg, f, valid);
    }
  }
}

// Protobuf's JSON mapping writes 64-bit integers as strings; the job's JSON shows every
// integer as a number, so that `jq '.model.d_model > 32'` means what it says.
void IntegersAsNumbers(const google::protobuf::Descriptor& d, nlohmann::ordered_json* j) {
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor* f = d.field(i);
    if (!j->contains(f->name())) continue;
    nlohmann::ordered_json& value = (*j)[f->name()];
    auto convert = [f](nlohmann::ordered_json& v) {
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        IntegersAsNumbers(*f->message_type(), &v);
      } else if (v.is_string() && f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
        v = std::stoll(v.get<std::string>());
      } else if (v.is_string() && f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
        v = std::stoull(v.get<std::string>());
      }
    };
    if (f->is_repeated()) {
      for (auto& v : value) convert(v);
    } else {
      convert(value);
    }
  }
}

}  // namespace

JobSpec WithDefaults(const JobSpec& spec) {
  JobSpec out = spec;
  if (!out.has_stages()) {
    const absl::StatusOr<schedule::ScheduleKind> kind = schedule::ParseScheduleKind(out.schedule());
    out.set_stages(PipelineStagesFor(out, kind.ok() ? *kind : schedule::ScheduleKind::kTwoBW));
  }
  SetDefaults(&out);
  return out;
}

std::string JobToJson(const JobSpec& spec) {
  JobSpec out = WithDefaults(spec);
  ReplaceInvalidUtf8(&out);
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string printed;
  const auto status = google::protobuf::util::MessageToJsonString(out, &printed, options);
  if (!status.ok()) {
    // Unreachable for a message with valid UTF-8: the printer fails on nothing else.
    return nlohmann::json({{"error", std::string(status.message())}}).dump();
  }
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(printed);
  IntegersAsNumbers(*JobSpec::descriptor(), &j);
  nlohmann::ordered_json ranges = nlohmann::ordered_json::array();
  for (const auto& r : j["stage_ranges"]) ranges.push_back({r["begin"], r["end"]});
  j["stage_ranges"] = std::move(ranges);
  return j.dump();
}

absl::StatusOr<JobSpec> JobFromJson(const std::string& json) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(json, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("job JSON: not JSON");
  if (j.is_object() && j.contains("stage_ranges") && j["stage_ranges"].is_array()) {
    for (auto& r : j["stage_ranges"]) {
      if (r.is_array() && r.size() == 2) r = {{"begin", r[0]}, {"end", r[1]}};
    }
  }
  JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(
      j.dump(), &spec, google::protobuf::util::JsonParseOptions());
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job JSON: ", status.message().as_string()));
  }
  return spec;
}

}  // namespace pipetrain::job
