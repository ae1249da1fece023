#include "runtime/weights/optimizer_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/errors.h"

namespace pipetrain::weights {

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  std::vector<std::string> errors;
  if (c.name != "sgd" && c.name != "adamw") {
    errors.push_back(absl::StrCat("unknown optimizer '", c.name, "' (known: sgd, adamw)"));
  }
  if (!(c.lr >= 0)) errors.push_back(absl::StrCat("optimizer.lr must be >= 0, got ", c.lr));
  if (c.weight_decay < 0) {
    errors.push_back(absl::StrCat("optimizer.weight_decay must be >= 0, got ", c.weight_decay));
  }
  if (c.momentum < 0 || c.momentum >= 1) {
    errors.push_back(absl::StrCat("optimizer.momentum must be in [0, 1), got ", c.momentum));
  }
  if (c.beta1 < 0 || c.beta1 >= 1 || c.beta2 < 0 || c.beta2 >= 1) {
    errors.push_back(
        absl::StrCat("optimizer.beta1/beta2 must be in [0, 1), got ", c.beta1, "/", c.beta2));
  }
  if (!(c.eps > 0)) errors.push_back(absl::StrCat("optimizer.eps must be > 0, got ", c.eps));
  const LearningRateSchedule& s = c.schedule;
  if (s.warmup_steps < 0) {
    errors.push_back(
        absl::StrCat("optimizer.schedule.warmup_steps must be >= 0, got ", s.warmup_steps));
  }
  if (s.decay_steps < 0) {
    errors.push_back(
        absl::StrCat("optimizer.schedule.decay_steps must be >= 0, got ", s.decay_steps));
  }
  // Against lr only where lr itself is valid (else that one violation is named, not two).
  if (!(s.min_lr >= 0) || (c.lr >= 0 && s.min_lr > c.lr)) {
    errors.push_back(absl::StrCat("optimizer.schedule.min_lr must be in [0, optimizer.lr = ", c.lr,
                                  "], got ", s.min_lr));
  }
  return InvalidArgumentList("", errors);
}

std::string_view LrDecayName(LrDecay decay) {
  switch (decay) {
    case LrDecay::kConstant: return "constant";
    case LrDecay::kLinear: return "linear";
    case LrDecay::kCosine: return "cosine";
  }
  return "?";
}

absl::StatusOr<LrDecay> ParseLrDecay(std::string_view name) {
  for (LrDecay d : {LrDecay::kConstant, LrDecay::kLinear, LrDecay::kCosine}) {
    if (name == LrDecayName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown decay '", std::string(name), "' (known: constant, linear, cosine)"));
}

double LearningRateAt(const OptimizerConfig& c, int64_t step, int64_t job_steps) {
  const LearningRateSchedule& s = c.schedule;
  if (c.lr == 0) return 0;  // frozen weights (min_lr is 0 too)
  if (step < s.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  if (s.decay == LrDecay::kConstant) return c.lr;
  const int64_t length = s.decay_steps > 0 ? s.decay_steps : job_steps - s.warmup_steps;
  const double progress =
      length <= 0
          ? 1.0
          : std::min(1.0, static_cast<double>(step - s.warmup_steps) / static_cast<double>(length));
  const double floor = s.min_lr / c.lr;
  const double shape =
      s.decay == LrDecay::kLinear ? 1 - progress : 0.5 * (1 + std::cos(M_PI * progress));
  return c.lr * (floor + (1 - floor) * shape);
}

}  // namespace pipetrain::weights
