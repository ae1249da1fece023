// StageExecutor's step commands (stage_executor.h, runtime/control/step_commands.h): which
// boundaries stage 0 seals when, what the checkpoint policy puts there, and applying a
// boundary's commands to the rest of the list.
#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/executor/stage_executor.h"

namespace pipetrain::executor {

int64_t StageExecutor::SealLead() const {
  if (!schedule::RunsContinuously(config_.schedule.kind)) return 2;
  // Stage 0 sends the last activation of mini-batch n − 1, which carries boundary n, after
  // 1 + ceil(p/m) fewer updates than n (its warm-up is p − 1 forwards).
  const int64_t p = layout_.ranks, m = config_.micro_batches;
  return std::max<int64_t>(2, 1 + (p + m - 1) / m);
}

bool StageExecutor::CarriesBoundary(int s, int64_t j) const {
  const int m = config_.micro_batches;
  return s + 1 < layout_.ranks && j % m == m - 1 && j / m + 1 < config_.schedule.steps;
}

uint32_t StageExecutor::PolicyCommands(int64_t n) const {
  const bool due = config_.checkpoint_every > 0 && n % config_.checkpoint_every == 0;
  return due ? static_cast<uint32_t>(control::kCheckpoint) : 0u;
}

absl::Status StageExecutor::SealBoundary(int64_t n) {
  uint32_t commands = (config_.commands ? config_.commands->Seal(n) : 0) | PolicyCommands(n);
  if (config_.replicas > 1) {
    // OR across the stage-0 ranks: the maximum of each bit.
    std::vector<at::Tensor> bits = {
        at::zeros({4}, at::TensorOptions().dtype(at::kLong).device(device_))};
    for (int b = 0; b < 4; ++b) {
      if (commands & (1u << b)) bits[0][b] = 1;
    }
    waiting_for_.store(kWaitingForReplicas, std::memory_order_relaxed);
    absl::Status reduced =
        transport_->AllReduce(transport::Group::Replicas(), bits, transport::ReduceOp::kMax,
                              absl::Now() + config_.recv_timeout);
    waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
    PT_RETURN_IF_ERROR(reduced);
    const at::Tensor any = bits[0].cpu();
    commands = 0;
    for (int b = 0; b < 4; ++b) {
      if (any[b].item<int64_t>() > 0) commands |= 1u << b;
    }
  }
  return ApplyBoundary(n, commands);
}

absl::Status StageExecutor::ApplyBoundary(int64_t n, uint32_t commands) {
  if ((commands & ~control::kAllStepCommands) != 0) {
    return absl::DataLossError(
        absl::StrCat("unknown step command bits ", commands, " for the boundary before step ", n));
  }
  boundary_commands_[n] = commands;
  if (!control::DrainsPipeline(commands)) return absl::OkStatus();
  schedule::ScheduleParams changed = actions_->params();
  if (commands & control::kStop) {
    changed.steps = static_cast<int>(n);
  } else {
    changed.flush_before.push_back(n);
  }
  absl::StatusOr<schedule::StageActionStream> rebased = actions_->Rebase(changed);
  if (!rebased.ok()) {
    return absl::InternalError(
        absl::StrCat("the ", control::StepCommandsName(commands), " before step ", n,
                     " reached this stage too late: ", rebased.status().message()));
  }
  *actions_ = std::move(*rebased);
  if (control::SwitchesToNewest(commands)) {
    for (Chunk& chunk : chunks_) PT_RETURN_IF_ERROR(chunk.weights->UseNewestFrom(n));
  }
  return absl::OkStatus();
}

void StageExecutor::NoteLiveVersions() {
  int stashed = 0, versions = 0;
  for (const Chunk& chunk : chunks_) {
    std::set<int64_t> live = {chunk.weights->newest_version()};
    for (const auto& [j, entry] : chunk.stash) live.insert(entry.version);
    versions = std::max({versions, static_cast<int>(live.size()), chunk.weights->held_versions()});
    stashed += static_cast<int>(chunk.stash.size());
  }
  stats_.peak_weight_versions = std::max(stats_.peak_weight_versions, versions);
  stats_.peak_stashed_microbatches = std::max(stats_.peak_stashed_microbatches, stashed);
  live_versions_now_.store(versions, std::memory_order_relaxed);
  stashed_now_.store(stashed, std::memory_order_relaxed);
}

}  // namespace pipetrain::executor
