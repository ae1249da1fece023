// Optimizers whose state is independent of which parameter tensors they update.
//
// PipeDream-2BW keeps two weight versions in two sets of tensors but one optimizer state
// (docs/design.md section 4.3: one optimizer state), so Step() takes the tensors to
// update and their gradients explicitly, and keeps its state by position. The arithmetic
// follows PyTorch's torch.optim.SGD (dampening 0, no Nesterov) and torch.optim.AdamW
// (no amsgrad) step by step; AdamW does it in one pass over each dense CPU parameter, the
// same operations per element in the same order. Not thread-safe: one stage thread owns an
// Optimizer.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::weights {

// One parameter's optimizer state, named as PyTorch's optimizers name it in their state
// dict: AdamW "step" (an int64 scalar), "exp_avg", "exp_avg_sq"; SGD "momentum_buffer".
// Empty before the parameter's first update (and for SGD without momentum).
using ParameterState = std::map<std::string, at::Tensor>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Updates params[i] in place with grads[i] (an undefined gradient counts as zero). The
  // i-th tensor must have the same shape in every call.
  virtual void Step(const std::vector<at::Tensor>& params,
                    const std::vector<at::Tensor>& grads) = 0;
  // The next Step()s use the learning rate of update `step` (LearningRateAt: the config's
  // schedule); before any call, that of step 0.
  void UseLearningRateOf(int64_t step) { lr_ = LearningRateAt(config_, step, job_steps_); }
  double learning_rate() const { return lr_; }
  // The kinds of the parameters Step() takes, by position (model::StageModule::
  // OwnParameterKinds): one of a kind in the config's no_decay is stepped with weight decay 0,
  // as a second parameter group would be in torch.optim. Before any call every one decays.
  void UseParameterKinds(std::vector<model::ParameterKinds> kinds) { kinds_ = std::move(kinds); }
  // The state of every parameter, by position (copies: later steps do not change them).
  virtual std::vector<ParameterState> State() const = 0;
  // Replaces the state with `state` (by position), as State() returned it; InvalidArgument,
  // changing nothing, for a name this optimizer does not keep or a missing one. The caller
  // checks the shapes against the parameters.
  virtual absl::Status LoadState(const std::vector<ParameterState>& state) = 0;

 protected:
  Optimizer(OptimizerConfig config, int64_t job_steps)
      : config_(std::move(config)),
        job_steps_(job_steps),
        lr_(LearningRateAt(config_, 0, job_steps)) {}
  // The weight decay of the i-th parameter: the config's, or 0 for a kind in no_decay.
  double WeightDecayOf(size_t i) const {
    return i < kinds_.size() && (kinds_[i] & config_.no_decay) != 0 ? 0.0 : config_.weight_decay;
  }

  const OptimizerConfig config_;
  const int64_t job_steps_;
  double lr_;
  std::vector<model::ParameterKinds> kinds_;
};

// `job_steps`: the job's steps, the schedule's decay length where it names none.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         int64_t job_steps = 0);

}  // namespace pipetrain::weights
