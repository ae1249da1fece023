// The optimizer of a job, as plain data (no LibTorch: the coordinator validates it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/parameter_kind.h"

namespace pipetrain::weights {

// How the learning rate falls after the warm-up (LearningRateSchedule).
enum class LrDecay { kConstant, kLinear, kCosine };

// "constant" | "linear" | "cosine".
std::string_view LrDecayName(LrDecay decay);
// The names above; InvalidArgument listing them for any other.
absl::StatusOr<LrDecay> ParseLrDecay(std::string_view name);

// The learning rate of each update as a function of its step t (0-based: the t-th update
// applies mini-batch t's gradient), as PyTorch's LambdaLR computes it, lr_t = lr · f(t):
//   f(t) = (t + 1) / warmup_steps                      for t < warmup_steps,
//   then, with progress q = min(1, (t − warmup_steps) / decay_steps) and r = min_lr / lr,
//   constant: f = 1;  linear: f = r + (1 − r)(1 − q);  cosine: f = r + (1 − r)(1 + cos(π q)) / 2.
// decay_steps 0: the job's steps after the warm-up. A function of t alone, so a resumed or
// recovered job continues it exactly.
struct LearningRateSchedule {
  int64_t warmup_steps = 0;
  LrDecay decay = LrDecay::kConstant;
  int64_t decay_steps = 0;
  double min_lr = 0.0;
};

struct OptimizerConfig {
  std::string name = "adamw";  // sgd | adamw
  double lr = 1e-3;
  double weight_decay = 0.0;  // sgd: coupled (added to the gradient); adamw: decoupled
  // Kinds of parameter (model::KindBit bits) that weight_decay skips, as a second parameter
  // group with weight_decay 0 would in torch.optim; default none, as torch.optim's one group.
  model::ParameterKinds no_decay = 0;
  double momentum = 0.9;  // sgd
  double beta1 = 0.9;     // adamw
  double beta2 = 0.999;   // adamw
  double eps = 1e-8;      // adamw
  LearningRateSchedule schedule = {};
};

// lr_t of `config` (LearningRateSchedule's formula) in a job of `job_steps` steps (the decay
// length where decay_steps is 0).
double LearningRateAt(const OptimizerConfig& config, int64_t step, int64_t job_steps);

// How many tensors the size of its parameters the optimizer keeps for them: AdamW two (the
// moments), SGD with momentum one (the buffer), plain SGD none. What the memory models count
// (runtime/planner's prediction, the coordinator's recovery placement).
inline int OptimizerStateCopies(const OptimizerConfig& config) {
  if (config.name == "adamw") return 2;
  return config.momentum != 0 ? 1 : 0;
}

// All invalid fields in one InvalidArgument ("; "-separated) (unknown name, lr < 0, betas
// outside [0, 1), a negative warm-up or decay length, min_lr outside [0, lr], ...).
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

}  // namespace pipetrain::weights
