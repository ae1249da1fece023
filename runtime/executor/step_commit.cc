// StageExecutor's step commit (stage_executor.h, StageConfig::commit_steps): the rank applies
// an update only once every rank of the job holds its final gradient, and after a fault
// applies the update it holds when the survivors' plan says so (runtime/recovery).
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/executor/stage_executor.h"

namespace pipetrain::executor {

absl::Status StageExecutor::CommitStep(int64_t t, ActionRecord& record) {
  // Held until the commit ends, and after a fault that ends it (with the loss, if known).
  commit_.held_step = t;
  const auto loss = job_losses_.find(t);
  commit_.held_loss =
      loss != job_losses_.end() ? std::optional<double>(loss->second) : std::nullopt;
  // This rank holds t's final gradient: it waits until every other rank of its pipeline does,
  // then until every replica of it does (each joins only once its own pipeline holds t's
  // gradient), so this ends only once every rank of the job does.
  if (config_.num_stages > 1) {
    PT_RETURN_IF_ERROR(
        AwaitCollective(transport::Group::Pipeline(), record, [&](absl::Time deadline) {
          return transport_->Barrier(transport::Group::Pipeline(), deadline);
        }));
  }
  if (config_.replicas == 1) return absl::OkStatus();
  return AwaitCollective(transport::Group::Replicas(), record, [&](absl::Time deadline) {
    return transport_->Barrier(transport::Group::Replicas(), deadline);
  });
}

absl::Status StageExecutor::ReduceStepLoss(const Chunk& chunk, int64_t t) {
  if (!config_.commit_steps || config_.replicas == 1 || !chunk.last || job_losses_.count(t)) {
    return absl::OkStatus();
  }
  std::vector<at::Tensor> loss = {at::full({1}, step_loss_sum_[t] / config_.micro_batches,
                                           at::TensorOptions().dtype(at::kDouble).device(device_))};
  waiting_for_.store(kWaitingForReplicas, std::memory_order_relaxed);
  absl::Status s = transport_->AllReduceMean(loss, absl::Now() + config_.recv_timeout);
  waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
  PT_RETURN_IF_ERROR(s);
  job_losses_[t] = loss[0].item<double>();
  return absl::OkStatus();
}

absl::Status StageExecutor::ApplyHeldUpdate() {
  if (commit_.held_step < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", config_.stage, " holds no update (its weights are W(", commit_.next_step, "))"));
  }
  for (Chunk& chunk : chunks_) PT_RETURN_IF_ERROR(chunk.weights->Update(commit_.held_step));
  commit_ = {commit_.held_step + 1, -1, std::nullopt};
  return absl::OkStatus();
}

}  // namespace pipetrain::executor
