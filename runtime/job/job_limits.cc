#include "runtime/job/job_limits.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "runtime/base/printable.h"
#include "runtime/job/job_config.h"

namespace pipetrain::job {
namespace {

constexpr double kU64Max = 18446744073709551615.0;

// 65536 -> "65,536"; 2^64 - 1 -> "2^64 - 1".
std::string FormatBound(double v) {
  if (v >= kU64Max) return "2^64 - 1";
  if (v != std::floor(v)) return absl::StrFormat("%.10g", v);
  std::string digits = absl::StrFormat("%.0f", std::fabs(v));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return (v < 0 ? "-" : "") + digits;
}

// The violation of `limit` by the number `v` (null: not a finite number), or "".
std::string Check(const FieldLimit& limit, const std::string& where, const nlohmann::json& v) {
  if (!v.is_number()) return absl::StrCat(where, ": must be a finite number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) return absl::StrCat(where, ": must be a finite number, got ", x);
  if (x < limit.min || x > limit.max) {
    return absl::StrCat(where, ": must be in [", FormatBound(limit.min), ", ",
                        FormatBound(limit.max), "] (", limit.reason, "), got ", v.dump());
  }
  return "";
}

// Printable UTF-8: nothing Printable() would escape.
bool IsPrintableUtf8(const std::string& s) { return Printable(s) == s; }

}  // namespace

const std::vector<FieldLimit>& JobFieldLimits() {
  static const std::vector<FieldLimit> limits = {
      {"model.d_model", 1, 65536, "wider than any published transformer"},
      {"model.n_heads", 1, 1024, "more heads than any published transformer"},
      {"model.n_layers", 1, 4096, "a layer each, built and held by one rank"},
      {"model.dropout", 0, 0.999, "a probability below 1"},
      {"model.hidden", 1, 1048576, "an mlp/cnn layer of hidden^2 parameters must fit one device"},
      {"model.hidden_layers", 1, 4096, "a layer each, built and held by one rank"},
      {"model.input_dim", 1, 16777216, "the synthetic features are held in memory"},
      {"model.image_shape", 1, 65536, "each of C, H, W"},
      {"model.num_classes", 2, 16777216, "a classifier needs two classes"},
      {"data.seq_len", 1, 1048576, "one sequence's activations must fit one device"},
      {"data.vocab", 0, 16777216, "the embedding and the output layer hold vocab x d_model"},
      {"data.branching", 1, 16777216, "at most the vocabulary"},
      {"data.num_tokens", 1, 268435456,
       "the synthetic corpus is generated in memory, 8 bytes a token (2 GiB)"},
      {"data.num_samples", 1, 16777216, "the synthetic samples are generated in memory"},
      {"data.seed", 0, kU64Max, "any 64-bit seed"},
      {"stages", 1, 1024, "one process or thread per stage"},
      {"virtual_stages", 0, 64, "model chunks a rank builds and holds (0: the schedule's)"},
      {"replicas", 1, 1024, "one process or thread per stage and replica"},
      {"bucket_kib", 1, 1048576, "one bucket is at most 1 GiB"},
      {"microbatches", 1, 65536, "every micro-batch of a step is in the schedule"},
      {"microbatch_size", 1, 65536, "one micro-batch's activations must fit one device"},
      {"steps", 1, 2147483647, "a 32-bit count (a stage's memory does not grow with it)"},
      {"optimizer.lr", 0, 1e3, "a finite step size; 0 leaves the weights as they are"},
      {"optimizer.weight_decay", 0, 1e3, "finite and not negative"},
      {"optimizer.momentum", 0, 0.999, "a decay below 1"},
      {"optimizer.beta1", 0, 0.999999, "a decay below 1"},
      {"optimizer.beta2", 0, 0.999999999, "a decay below 1"},
      {"optimizer.eps", 1e-30, 1, "positive, so the update never divides by zero"},
      {"optimizer.clip_grad_norm", 0, 1e12, "a finite norm (0: no clipping)"},
      {"optimizer.schedule.warmup_steps", 0, 2147483647, "a step count"},
      {"optimizer.schedule.decay_steps", 0, 2147483647, "a step count (0: the steps left)"},
      {"optimizer.schedule.min_lr", 0, 1e3, "finite, not negative and at most optimizer.lr"},
      {"seed", 0, kU64Max, "any 64-bit seed"},
      {"threads_per_stage", 0, 256, "intra-op threads of one stage (0: cores / stages)"},
      {"checkpoint.every", 0, 2147483647, "a step count (0: no policy)"},
      {"checkpoint.keep", 1, 10000, "complete checkpoints on disk at once"},
      {"eval.every", 0, 2147483647, "a step count (0: no evaluation)"},
      {"eval.batches", 1, 65536, "micro-batches of one evaluation, each replica's"},
      {"eval.split", 0, 0.5, "at most half the samples held out of training"},
      {"timeout_s", 0.001, 86400, "a wait for a peer lasts at most a day"},
      {"max_restarts", 0, 1000, "each restart is listed in the job's status"},
      {"nonfinite_limit", 1, 1000000, "steps skipped in a row before the job fails"},
  };
  return limits;
}

std::vector<std::string> LimitViolations(const JobConfig& config) {
  std::vector<std::string> errors;
  const nlohmann::json j = nlohmann::json::parse(JobConfigToJson(config));
  for (const FieldLimit& limit : JobFieldLimits()) {
    const nlohmann::json::json_pointer pointer(
        "/" + absl::StrReplaceAll(limit.path, {{".", "/"}}));
    const nlohmann::json& v = j.at(pointer);
    if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) {
        std::string e = Check(limit, absl::StrCat(limit.path, "[", i, "]"), v[i]);
        if (!e.empty()) errors.push_back(std::move(e));
      }
    } else if (std::string e = Check(limit, limit.path, v); !e.empty()) {
      errors.push_back(std::move(e));
    }
  }
  if (static_cast<double>(config.stages) * config.replicas > kMaxRanks) {
    errors.push_back(absl::StrCat("replicas: stages x replicas must be at most ",
                                  FormatBound(kMaxRanks), " (a rank each, all listed in the "
                                  "job's status), got ", int64_t{config.stages} * config.replicas));
  }
  if (config.name.size() > kMaxNameBytes || !IsPrintableUtf8(config.name)) {
    errors.push_back(absl::StrCat("name: must be at most ", kMaxNameBytes,
                                  " bytes of printable UTF-8, got ", config.name.size(),
                                  " bytes", IsPrintableUtf8(config.name) ? "" : " with control "
                                  "characters or invalid UTF-8"));
  }
  for (const auto& [path, value] : {std::pair<const char*, const std::string*>{
                                        "model.path", &config.model.torchscript_path},
                                    {"data.path", &config.data.path},
                                    {"weights_dir", &config.weights_dir},
                                    {"checkpoint.dir", &config.checkpoint.dir},
                                    {"resume_from", &config.resume_from}}) {
    if (value->size() > kMaxPathBytes || !IsPrintableUtf8(*value)) {
      errors.push_back(absl::StrCat(path, ": must be a path of at most ", kMaxPathBytes,
                                    " bytes without control characters"));
    }
  }
  return errors;
}

std::string LimitsMarkdown() {
  std::string md = "| field | min | max | why |\n|---|---|---|---|\n";
  for (const FieldLimit& l : JobFieldLimits()) {
    absl::StrAppend(&md, "| `", l.path, "` | ", FormatBound(l.min), " | ", FormatBound(l.max),
                    " | ", l.reason, " |\n");
  }
  absl::StrAppend(&md, "\nAlso: every number finite; `stages` x `replicas` at most ", FormatBound(kMaxRanks),
                  " (a rank each, all listed in the job's status); "
                  "`name` at most ", kMaxNameBytes,
                  " bytes of printable UTF-8; `model.path`, `data.path`, `weights_dir`, "
                  "`checkpoint.dir` and `resume_from` at most ", kMaxPathBytes,
                  " bytes without control characters.\n");
  return md;
}

}  // namespace pipetrain::job
