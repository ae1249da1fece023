// The un-pipelined reference trainer: the same model as one stage, on the same
// initialization and data, with LibTorch's own optimizers (torch::optim::SGD, AdamW), so that
// a pipelined run's exactness is checked against code it does not share (docs/design.md
// section 9). Float64 when the job says so.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/report/report.h"

namespace pipetrain::job {

// Trains the same model as one stage, micro-batch by micro-batch (loss scaled by 1/m),
// with torch::optim::SGD/AdamW, the learning rate of update t set as LambdaLR would (its own
// factor function, not the runtime's); for 2BW with the delayed update
// W(t+1) = W(t) - step(grad f(W(t-1))), W(-1) = W(0), and for each weight-version switch at
// boundary N in `switch_at`, mini-batch N's gradient taken on W(N) (the rule restarts
// there); for pipedream each stage's gradient taken on the version its forward ran on
// (vertical sync: stage 0's), each boundary in `switch_at` a drain after which every stage
// starts on its newest version (pipedream's switches, flushes and checkpoints alike). Tied
// weights (model::TiedParameters) are one parameter: the group's first member, the others
// aliases whose gradients add to its gradient and which take its new value.
// Clipping (the optimizer's norm threshold): LibTorch's torch::nn::utils norm clipping over
// every trained parameter (a tie once) before each update, on the gradient that update applies
// (2BW's: mini-batch t's, taken on W(t-1)); each update's norm is appended to `grad_norms` when
// given. Parameters of a kind in optimizer.no_decay are a second torch.optim parameter group, with
// weight_decay 0.
// Returns the final parameters in layer order. Float64 when the job says so.
enum class ReferenceClipping {
  kWholeModel,     // one norm over the whole model: the semantics
  kEachStageAlone  // each model stage clipped by its own norm: a negative control, never right
};
// Evaluation (config.eval()): at every boundary N that is a multiple of eval.every, the model of
// W(N) in evaluation mode on each replica's evaluated micro-batches (MicroBatchReader::
// EvalInputs), the mean loss and accuracy over them, averaged over the replicas, appended to
// `evals` when given; training itself is untouched.
absl::StatusOr<std::vector<at::Tensor>> TrainReference(
    const JobSpec& config, const std::vector<int64_t>& switch_at = {},
    ReferenceClipping clipping = ReferenceClipping::kWholeModel,
    std::vector<double>* grad_norms = nullptr, std::vector<EvalPoint>* evals = nullptr);

// max over tensors of ||a - b|| / ||b|| (b: the reference); 0/0 counts as 0.
double MaxRelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

}  // namespace pipetrain::job
