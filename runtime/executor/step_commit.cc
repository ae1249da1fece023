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

using transport::MessageKind;

absl::Status StageExecutor::CommitStep(int64_t t, ActionRecord& record) {
  // Held until the commit ends, and after a fault that ends it (with the loss, if known).
  commit_.held_step = t;
  const auto loss = job_losses_.find(t);
  commit_.held_loss =
      loss != job_losses_.end() ? std::optional<double>(loss->second) : std::nullopt;
  const at::Tensor ready =
      at::ones({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
  // This rank holds t's final gradient: it tells every other rank of its pipeline (sends
  // never block), then learns that each of them does too.
  if (config_.num_stages > 1) {
    const transport::TensorSpec spec = transport::SpecOf(ready);
    for (int r = 0; r < config_.num_stages; ++r) {
      if (r != config_.stage) {
        PT_RETURN_IF_ERROR(transport_->Send(r, MessageKind::kStepCommit, t, ready));
      }
    }
    for (int r = 0; r < config_.num_stages; ++r) {
      if (r == config_.stage) continue;
      PT_RETURN_IF_ERROR(Receive(r, MessageKind::kStepCommit, t, t, spec, record).status());
    }
  }
  // Each replica of this rank joins only once its own pipeline holds t's gradient, so this
  // ends only once every rank of the job does.
  std::vector<at::Tensor> flag = {ready.clone()};
  const double start = MonotonicSeconds();
  waiting_for_.store(kWaitingForReplicas, std::memory_order_relaxed);
  absl::Status s = transport_->AllReduceMean(flag, absl::Now() + config_.recv_timeout);
  waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
  record.wait_s += MonotonicSeconds() - start;
  return s;
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
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", config_.stage, " holds no update (its weights are W(",
                     commit_.next_step, "))"));
  }
  for (Chunk& chunk : chunks_) PT_RETURN_IF_ERROR(chunk.weights->Update(commit_.held_step));
  commit_ = {commit_.held_step + 1, -1, std::nullopt};
  return absl::OkStatus();
}

}  // namespace pipetrain::executor
