// The optimizer of a job, as plain data (no LibTorch: the coordinator validates it).
#pragma once

#include <string>

#include "absl/status/status.h"

namespace pipetrain::weights {

struct OptimizerConfig {
  std::string name = "adamw";  // sgd | adamw
  double lr = 1e-3;
  double weight_decay = 0.0;  // sgd: coupled (added to the gradient); adamw: decoupled
  double momentum = 0.9;      // sgd
  double beta1 = 0.9;         // adamw
  double beta2 = 0.999;       // adamw
  double eps = 1e-8;          // adamw
};

// How many tensors the size of its parameters the optimizer keeps for them: AdamW two (the
// moments), SGD with momentum one (the buffer), plain SGD none. What the memory models count
// (runtime/planner's prediction, the coordinator's recovery placement).
inline int OptimizerStateCopies(const OptimizerConfig& config) {
  if (config.name == "adamw") return 2;
  return config.momentum != 0 ? 1 : 0;
}

// All invalid fields in one InvalidArgument ("; "-separated) (unknown name, lr <= 0, betas
// outside [0, 1), ...).
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

}  // namespace pipetrain::weights
