#include "runtime/model/weight_gradients.h"

#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace pipetrain::model {

void WeightGradientQueue::Run() {
  // As the engine runs a backward: no graph is recorded for the gradients.
  torch::autograd::AutoGradMode no_grad(false);
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  for (std::function<void()>& w : work) w();
}

void AccumulateGradient(const at::Tensor& parameter, at::Tensor gradient) {
  at::Tensor& grad = parameter.mutable_grad();
  // The engine's own accumulation, so that the bits are the same as a full backward's.
  torch::autograd::AccumulateGrad::accumulateGrad(
      parameter, grad, gradient, /*num_expected_refs=*/1,
      [&grad](at::Tensor&& updated) { grad = std::move(updated); });
}

}  // namespace pipetrain::model
