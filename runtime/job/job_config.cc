#include "runtime/job/job_config.h"

#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/errors.h"

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

// Reads typed fields from a YAML mapping, collecting every error with its path.
class YamlReader {
 public:
  explicit YamlReader(std::vector<std::string>* errors) : errors_(errors) {}

  // Checks that `node` is a mapping with only `known` keys.
  bool Mapping(const YAML::Node& node, const std::string& path,
               const std::set<std::string>& known) {
    if (!node.IsMap()) {
      errors_->push_back(absl::StrCat(path.empty() ? "job" : path, ": expected a mapping"));
      return false;
    }
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      if (!known.count(key)) {
        errors_->push_back(absl::StrCat(Join(path, key), ": unknown key (known: ",
                                        absl::StrJoin(known, ", "), ")"));
      }
    }
    return true;
  }

  template <typename T>
  void Read(const YAML::Node& map, const std::string& path, const std::string& key, T* out) {
    const YAML::Node node = map[key];
    if (!node) return;
    try {
      *out = node.as<T>();
    } catch (const YAML::Exception&) {
      errors_->push_back(absl::StrCat(Join(path, key), ": expected ", TypeName<T>(), ", got '",
                                      Scalar(node), "'"));
    }
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }
  static std::string Scalar(const YAML::Node& node) {
    if (node.IsScalar()) return node.Scalar();
    std::stringstream ss;
    ss << node;
    std::string s = ss.str();
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s;
  }

  std::vector<std::string>* errors() { return errors_; }

 private:
  template <typename T>
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    if constexpr (std::is_floating_point_v<T>) return "a number";
    if constexpr (std::is_integral_v<T>) return "an integer";
    if constexpr (std::is_same_v<T, std::string>) return "a string";
    return "a list";
  }
  std::vector<std::string>* errors_;
};

void ReadModel(YamlReader& r, const YAML::Node& n, model::ModelConfig* m) {
  if (!r.Mapping(n, "model",
                 {"name", "d_model", "n_heads", "n_layers", "dropout", "hidden",
                  "hidden_layers", "input_dim", "image_shape", "num_classes", "path"})) {
    return;
  }
  r.Read(n, "model", "name", &m->name);
  r.Read(n, "model", "d_model", &m->d_model);
  r.Read(n, "model", "n_heads", &m->n_heads);
  r.Read(n, "model", "n_layers", &m->n_layers);
  r.Read(n, "model", "dropout", &m->dropout);
  r.Read(n, "model", "hidden", &m->hidden);
  r.Read(n, "model", "hidden_layers", &m->hidden_layers);
  r.Read(n, "model", "input_dim", &m->input_dim);
  r.Read(n, "model", "image_shape", &m->image_shape);
  r.Read(n, "model", "num_classes", &m->num_classes);
  r.Read(n, "model", "path", &m->torchscript_path);
}

void ReadData(YamlReader& r, const YAML::Node& n, DataConfig* d) {
  if (!r.Mapping(n, "data", {"kind", "path", "seq_len", "vocab", "branching", "num_tokens",
                             "num_samples", "seed"})) {
    return;
  }
  r.Read(n, "data", "kind", &d->kind);
  r.Read(n, "data", "path", &d->path);
  r.Read(n, "data", "seq_len", &d->seq_len);
  r.Read(n, "data", "vocab", &d->vocab);
  r.Read(n, "data", "branching", &d->branching);
  r.Read(n, "data", "num_tokens", &d->num_tokens);
  r.Read(n, "data", "num_samples", &d->num_samples);
  r.Read(n, "data", "seed", &d->seed);
}

void ReadOptimizer(YamlReader& r, const YAML::Node& n, weights::OptimizerConfig* o) {
  if (!r.Mapping(n, "optimizer",
                 {"name", "lr", "weight_decay", "momentum", "beta1", "beta2", "eps"})) {
    return;
  }
  r.Read(n, "optimizer", "name", &o->name);
  r.Read(n, "optimizer", "lr", &o->lr);
  r.Read(n, "optimizer", "weight_decay", &o->weight_decay);
  r.Read(n, "optimizer", "momentum", &o->momentum);
  r.Read(n, "optimizer", "beta1", &o->beta1);
  r.Read(n, "optimizer", "beta2", &o->beta2);
  r.Read(n, "optimizer", "eps", &o->eps);
}

// stages: 4 | "0:2,2:7" | [[0, 2], [2, 7]]
void ReadStages(YamlReader& r, const YAML::Node& n, JobConfig* job) {
  if (n.IsScalar()) {
    int count = 0;
    if (absl::SimpleAtoi(n.Scalar(), &count)) {
      job->stages = count;
      job->stage_ranges.clear();
      return;
    }
    auto ranges = model::ParseRanges(n.Scalar());
    if (!ranges.ok()) {
      r.errors()->push_back(absl::StrCat("stages: ", ranges.status().message()));
      return;
    }
    job->stage_ranges = *ranges;
  } else if (n.IsSequence()) {
    job->stage_ranges.clear();
    for (size_t i = 0; i < n.size(); ++i) {
      std::vector<int> pair;
      try {
        pair = n[i].as<std::vector<int>>();
      } catch (const YAML::Exception&) {
      }
      if (pair.size() != 2) {
        r.errors()->push_back(absl::StrCat("stages[", i, "]: expected [begin, end], got '",
                                           YamlReader::Scalar(n[i]), "'"));
        continue;
      }
      job->stage_ranges.push_back({pair[0], pair[1]});
    }
  } else {
    r.errors()->push_back("stages: expected a count, \"0:2,2:7\" or [[0, 2], [2, 7]]");
    return;
  }
  job->stages = static_cast<int>(job->stage_ranges.size());
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

int PipelineStages(const JobConfig& config) {
  return config.stage_ranges.empty() ? config.stages
                                     : static_cast<int>(config.stage_ranges.size());
}

absl::StatusOr<bool> ParseFloat64Dtype(const std::string& text) {
  if (text == "float64" || text == "double") return true;
  if (text == "float32" || text == "float") return false;
  return absl::InvalidArgumentError(
      absl::StrCat("expected float32 or float64, got '", text, "'"));
}

std::string EffectiveDataKind(const JobConfig& config) {
  if (!config.data.kind.empty()) return config.data.kind;
  return (config.model.name == "mlp" || config.model.name == "cnn") ? "classification"
                                                                     : "synthetic";
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
    if ((c.model.name == "mlp" || c.model.name == "cnn") && token_data) {
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

  if (c.stages < 1) errors.push_back(absl::StrCat("stages: must be >= 1, got ", c.stages));
  if (c.replicas < 1) errors.push_back(absl::StrCat("replicas: must be >= 1, got ", c.replicas));
  if (c.bucket_kib < 1) errors.push_back(absl::StrCat("bucket_kib: must be >= 1, got ", c.bucket_kib));
  if (!c.stage_ranges.empty() && static_cast<int>(c.stage_ranges.size()) != c.stages) {
    errors.push_back(absl::StrCat("stages: ", c.stage_ranges.size(),
                                  " layer ranges given for ", c.stages, " stages"));
  }
  if (c.micro_batch_size < 1) {
    errors.push_back(absl::StrCat("microbatch_size: must be >= 1, got ", c.micro_batch_size));
  }
  if (c.steps < 1) errors.push_back(absl::StrCat("steps: must be >= 1, got ", c.steps));
  schedule::ScheduleParams params{c.schedule, c.stages, c.micro_batches, 1};
  if (c.micro_batches < 1) {
    errors.push_back(absl::StrCat("microbatches: must be >= 1, got ", c.micro_batches));
  } else if (c.stages >= 1) {
    if (absl::Status s = schedule::ValidateScheduleParams(params); !s.ok()) {
      for (const std::string& v : ViolationsOf(s)) errors.push_back(absl::StrCat("schedule: ", v));
    }
  }
  // The partition against the model's layers, named, when they are known without building
  // it (built-in models); the runner checks it again (a TorchScript model's only there).
  const std::optional<std::vector<std::string>> layers = KnownLayerNames(c.model);
  if (layers && !c.stage_ranges.empty()) {
    const absl::Status partition = model::ValidatePartition(c.stage_ranges, *layers);
    for (std::string v : ViolationsOf(partition)) {
      // The first one starts "invalid partition 0:2,3:5: ".
      if (absl::StartsWith(v, "invalid partition ")) v = v.substr(v.find(": ") + 2);
      errors.push_back(absl::StrCat("stages: ", v));
    }
  } else if (layers && c.stage_ranges.empty() && c.stages > static_cast<int>(layers->size())) {
    errors.push_back(absl::StrCat("stages: ", c.stages, " stages for a model of ",
                                  layers->size(), " layers (", absl::StrJoin(*layers, ", "),
                                  "): each stage needs at least one layer"));
  }
  if (c.recompute.mode == RecomputeConfig::Mode::kStages) {
    for (int s : c.recompute.indices) {
      if (s >= c.stages) {
        errors.push_back(absl::StrCat("recompute: stage ", s, " does not exist (", c.stages,
                                      " stages)"));
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
  if (!(c.recv_timeout_s > 0)) {
    errors.push_back(absl::StrCat("timeout_s: must be > 0, got ", c.recv_timeout_s));
  }
  return InvalidArgumentList("invalid job", errors);
}

absl::StatusOr<JobConfig> ParseJobYaml(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed YAML: ", e.msg, " at line ",
                                                   e.mark.line + 1, ", column ",
                                                   e.mark.column + 1));
  }
  JobConfig job;
  if (!root || root.IsNull()) return absl::InvalidArgumentError("empty job spec");
  std::vector<std::string> errors;
  YamlReader r(&errors);
  if (!r.Mapping(root, "",
                 {"model", "data", "schedule", "stages", "replicas", "overlap_allreduce",
                  "bucket_kib", "microbatches",
                  "microbatch_size",
                  "steps", "optimizer", "recompute", "seed", "dtype", "threads_per_stage",
                  "timeout_s"})) {
    return InvalidArgumentList("invalid job", errors);
  }
  if (root["model"]) ReadModel(r, root["model"], &job.model);
  if (root["data"]) ReadData(r, root["data"], &job.data);
  if (root["optimizer"]) ReadOptimizer(r, root["optimizer"], &job.optimizer);
  if (root["stages"]) ReadStages(r, root["stages"], &job);
  std::string schedule_name, recompute = "none", dtype = "float32";
  r.Read(root, "", "schedule", &schedule_name);
  if (!schedule_name.empty()) {
    auto kind = schedule::ParseScheduleKind(schedule_name);
    if (kind.ok()) {
      job.schedule = *kind;
    } else {
      // One violation: its list of names must not read as more ("; " separates them).
      errors.push_back(absl::StrCat(
          "schedule: ", absl::StrReplaceAll(kind.status().message(), {{"; ", ", "}})));
    }
  }
  r.Read(root, "", "replicas", &job.replicas);
  r.Read(root, "", "overlap_allreduce", &job.overlap_allreduce);
  r.Read(root, "", "bucket_kib", &job.bucket_kib);
  r.Read(root, "", "microbatches", &job.micro_batches);
  r.Read(root, "", "microbatch_size", &job.micro_batch_size);
  r.Read(root, "", "steps", &job.steps);
  r.Read(root, "", "seed", &job.seed);
  r.Read(root, "", "threads_per_stage", &job.threads_per_stage);
  r.Read(root, "", "timeout_s", &job.recv_timeout_s);
  r.Read(root, "", "recompute", &recompute);
  if (auto rc = ParseRecompute(recompute); rc.ok()) {
    job.recompute = *rc;
  } else {
    errors.push_back(std::string(rc.status().message()));
  }
  r.Read(root, "", "dtype", &dtype);
  if (absl::StatusOr<bool> f64 = ParseFloat64Dtype(dtype); f64.ok()) {
    job.float64 = *f64;
  } else {
    errors.push_back(absl::StrCat("dtype: ", f64.status().message()));
  }
  if (!errors.empty()) return InvalidArgumentList("invalid job", errors);
  if (absl::Status s = ValidateJobConfig(job); !s.ok()) return s;
  return job;
}

absl::StatusOr<JobConfig> LoadJobYaml(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  auto job = ParseJobYaml(ss.str());
  if (!job.ok()) {
    return absl::Status(job.status().code(),
                        absl::StrCat(path, ": ", job.status().message()));
  }
  return job;
}

std::string JobConfigToYaml(const JobConfig& c) {
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  out << YAML::BeginMap;
  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << c.model.name;
  if (!c.model.torchscript_path.empty()) {
    out << YAML::Key << "path" << YAML::Value << c.model.torchscript_path;
  }
  out << YAML::Key << "d_model" << YAML::Value << c.model.d_model;
  out << YAML::Key << "n_heads" << YAML::Value << c.model.n_heads;
  out << YAML::Key << "n_layers" << YAML::Value << c.model.n_layers;
  out << YAML::Key << "dropout" << YAML::Value << c.model.dropout;
  out << YAML::Key << "input_dim" << YAML::Value << c.model.input_dim;
  out << YAML::Key << "image_shape" << YAML::Value << YAML::Flow << c.model.image_shape;
  out << YAML::Key << "hidden" << YAML::Value << c.model.hidden;
  out << YAML::Key << "hidden_layers" << YAML::Value << c.model.hidden_layers;
  out << YAML::Key << "num_classes" << YAML::Value << c.model.num_classes;
  out << YAML::EndMap;
  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  if (!c.data.kind.empty()) out << YAML::Key << "kind" << YAML::Value << c.data.kind;
  if (!c.data.path.empty()) out << YAML::Key << "path" << YAML::Value << c.data.path;
  out << YAML::Key << "seq_len" << YAML::Value << c.data.seq_len;
  out << YAML::Key << "vocab" << YAML::Value << c.data.vocab;
  out << YAML::Key << "branching" << YAML::Value << c.data.branching;
  out << YAML::Key << "num_tokens" << YAML::Value << c.data.num_tokens;
  out << YAML::Key << "num_samples" << YAML::Value << c.data.num_samples;
  out << YAML::Key << "seed" << YAML::Value << c.data.seed;
  out << YAML::EndMap;
  out << YAML::Key << "schedule" << YAML::Value << std::string(schedule::ScheduleKindName(c.schedule));
  if (c.stage_ranges.empty()) {
    out << YAML::Key << "stages" << YAML::Value << c.stages;
  } else {
    out << YAML::Key << "stages" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const model::LayerRange& r : c.stage_ranges) {
      out << YAML::Flow << std::vector<int>{r.begin, r.end};
    }
    out << YAML::EndSeq;
  }
  out << YAML::Key << "replicas" << YAML::Value << c.replicas;
  out << YAML::Key << "overlap_allreduce" << YAML::Value << c.overlap_allreduce;
  out << YAML::Key << "bucket_kib" << YAML::Value << c.bucket_kib;
  out << YAML::Key << "microbatches" << YAML::Value << c.micro_batches;
  out << YAML::Key << "microbatch_size" << YAML::Value << c.micro_batch_size;
  out << YAML::Key << "steps" << YAML::Value << c.steps;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << c.optimizer.name;
  out << YAML::Key << "lr" << YAML::Value << c.optimizer.lr;
  out << YAML::Key << "weight_decay" << YAML::Value << c.optimizer.weight_decay;
  out << YAML::Key << "momentum" << YAML::Value << c.optimizer.momentum;
  out << YAML::Key << "beta1" << YAML::Value << c.optimizer.beta1;
  out << YAML::Key << "beta2" << YAML::Value << c.optimizer.beta2;
  out << YAML::Key << "eps" << YAML::Value << c.optimizer.eps;
  out << YAML::EndMap;
  out << YAML::Key << "recompute" << YAML::Value << FormatRecompute(c.recompute);
  out << YAML::Key << "seed" << YAML::Value << c.seed;
  out << YAML::Key << "dtype" << YAML::Value << (c.float64 ? "float64" : "float32");
  out << YAML::Key << "threads_per_stage" << YAML::Value << c.threads_per_stage;
  out << YAML::Key << "timeout_s" << YAML::Value << c.recv_timeout_s;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace pipetrain::job
