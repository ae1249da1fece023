// StageExecutor's gradients across ranks (stage_executor.h): the replicas' AllReduce (at the
// update, started after a model stage's last B or W, or Hippie's buckets during stage 0's
// final backward), the sum of tied parameters' copies, and clipping by the pipeline's norm.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/executor/stage_executor.h"

namespace pipetrain::executor {

absl::Status StageExecutor::ReduceGradients(Chunk& chunk, int64_t t) {
  if (config_.replicas == 1) return absl::OkStatus();
  if (reduced_steps_.erase(t)) return absl::OkStatus();  // done during the backward
  PT_RETURN_IF_ERROR(ReduceStepLoss(chunk, t));          // (if not done when it started)
  const double start = MonotonicSeconds();
  waiting_for_.store(kWaitingForReplicas, std::memory_order_relaxed);
  absl::Status s;
  AllReduceRecord record{t, -1, start, 0};
  if (chunk.reduction) {  // started after the chunk's last backward: its wait
    s = chunk.reduction->Wait(absl::Now() + config_.recv_timeout);
    chunk.reduction.reset();
    record.start_s = chunk.reduction_record.start_s;
  } else {
    absl::StatusOr<std::vector<at::Tensor>> grads = chunk.weights->Gradients(t);
    s = grads.ok() ? transport_->AllReduceMean(*grads, absl::Now() + config_.recv_timeout)
                   : grads.status();
  }
  waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
  record.end_s = MonotonicSeconds();
  step_allreduce_s_ += record.end_s - start;  // what the update waited for
  Keep(stats_.allreduces, record, config_.history.allreduces);
  return s;
}

absl::Status StageExecutor::SumTiedGradients(int64_t t, ActionRecord& record) {
  for (const TiedParameter& tie : config_.tied) {
    if (tie.copies.size() < 2) continue;  // one rank: one parameter
    const auto mine = std::find_if(tie.copies.begin(), tie.copies.end(),
                                   [&](const auto& c) { return c.rank == config_.stage; });
    if (mine == tie.copies.end()) continue;
    std::vector<int> holders;
    for (const TiedParameter::Copy& copy : tie.copies) holders.push_back(copy.rank);
    std::sort(holders.begin(), holders.end());
    PT_ASSIGN_OR_RETURN(std::vector<at::Tensor> stage_grads,
                        ChunkOf(mine->stage).weights->Gradients(t));
    // The one parameter's gradient: the copies' sum (in rank order, alike on every holder).
    std::vector<at::Tensor> grad = {stage_grads.at(static_cast<size_t>(mine->parameter))};
    const transport::Group group = transport::Group::PipelineStages(std::move(holders));
    PT_RETURN_IF_ERROR(AwaitCollective(group, record, [&](absl::Time deadline) {
      return transport_->AllReduce(group, grad, transport::ReduceOp::kSum, deadline);
    }));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> StageExecutor::ClipGradients(int64_t t, ActionRecord& record) {
  std::vector<std::vector<at::Tensor>> grads;
  double mine = 0;  // this rank's part: its gradients' sum of squares
  for (Chunk& chunk : chunks_) {
    PT_ASSIGN_OR_RETURN(grads.emplace_back(), chunk.weights->Gradients(t));
    const std::vector<at::Tensor>& g = grads.back();
    for (size_t i = 0; i < g.size(); ++i) {
      if (uncounted_copies_.count({chunk.stage, static_cast<int>(i)})) continue;
      const double n = g[i].norm().item<double>();
      mine += n * n;
    }
  }
  // The parts of every rank of the pipeline, summed in rank order: every rank has the same
  // norm to the bit.
  std::vector<at::Tensor> squares = {
      at::full({1}, mine, at::TensorOptions().dtype(at::kDouble).device(device_))};
  if (config_.num_stages > 1) {
    PT_RETURN_IF_ERROR(
        AwaitCollective(transport::Group::Pipeline(), record, [&](absl::Time deadline) {
          return transport_->AllReduce(transport::Group::Pipeline(), squares,
                                       transport::ReduceOp::kSum, deadline);
        }));
  }
  const double norm = std::sqrt(squares[0].item<double>());
  // clip_grad_norm_'s coefficient; a non-finite norm poisons every gradient instead, so that
  // every stage of every replica skips this step alike (WeightStore::Update).
  const double scale = std::isfinite(norm) ? std::min(1.0, config_.clip_grad_norm / (norm + 1e-6))
                                           : std::numeric_limits<double>::quiet_NaN();
  if (scale != 1.0) {
    at::NoGradGuard no_grad;
    for (std::vector<at::Tensor>& g : grads) {
      for (at::Tensor& tensor : g) tensor.mul_(scale);
    }
  }
  return norm;
}

void StageExecutor::FoldSharedGradients() {
  if (!shares_parameters_) return;
  for (Chunk& chunk : chunks_) chunk.weights->FoldSharedGradients();
}

void StageExecutor::GradientDone(Chunk& chunk, int64_t j) {
  if (config_.replicas == 1 || !schedule::HoldsChunks(config_.schedule.kind) ||
      ++chunk.gradients_done < config_.micro_batches) {
    return;
  }
  const int64_t t = j / config_.micro_batches;
  if (!shares_parameters_) {
    StartReduction(chunk, t);
    return;
  }
  // A chunk's gradient may hold another's uses of a shared parameter: all start together.
  for (const Chunk& c : chunks_) {
    if (c.gradients_done < config_.micro_batches) return;
  }
  FoldSharedGradients();
  for (Chunk& c : chunks_) StartReduction(c, t);
}

void StageExecutor::StartReduction(Chunk& chunk, int64_t t) {
  chunk.gradients_done = 0;
  // A failure here leaves the loss to ReduceGradients, which then fails the same way.
  if (!ReduceStepLoss(chunk, t).ok()) return;
  absl::StatusOr<std::vector<at::Tensor>> grads = chunk.weights->Gradients(t);
  if (!grads.ok()) return;  // the update reduces them (and fails the same way)
  chunk.reduction_record = {t, -1, MonotonicSeconds(), 0};
  chunk.reduction =
      transport_->StartAllReduceMean(*std::move(grads), absl::Now() + config_.recv_timeout);
}

namespace {

// Calls `on_ready` after a parameter's gradient accumulator has run (its .grad is final for
// this backward).
class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradientReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

}  // namespace

absl::Status StageExecutor::BackwardWithBucketedAllReduce(int64_t j, model::StageModule& module,
                                                          const std::function<void()>& backward) {
  const int64_t t = j / config_.micro_batches;
  const absl::Time deadline = absl::Now() + config_.recv_timeout;
  std::vector<at::Tensor> params = module.Parameters();
  if (buckets_.empty()) {
    // Reverse parameter order: roughly the order backward finalizes them.
    bucket_of_.resize(params.size());
    int64_t bytes = config_.bucket_bytes;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      if (bytes >= config_.bucket_bytes) {
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().push_back(i);
      bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
      bytes += params[i].numel() * params[i].element_size();
    }
  }
  const std::vector<std::vector<int>>& buckets = buckets_;
  const std::vector<int>& bucket_of = bucket_of_;
  std::vector<int> missing(buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) missing[b] = static_cast<int>(buckets[b].size());
  std::vector<std::unique_ptr<transport::Transport::PendingReduction>> pending(buckets.size());
  std::vector<AllReduceRecord> launched(buckets.size());
  auto launch = [&](int b) {
    std::vector<at::Tensor> grads;
    for (int i : buckets[b]) {
      if (!params[i].grad().defined()) params[i].mutable_grad() = at::zeros_like(params[i]);
      grads.push_back(params[i].grad());
    }
    launched[b] = {t, b, MonotonicSeconds(), 0};
    pending[b] = transport_->StartAllReduceMean(std::move(grads), deadline);
  };
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(params[i]);
    const int b = bucket_of[i];
    auto key = accumulator->add_post_hook(std::make_unique<GradientReadyHook>([&, b] {
      if (--missing[b] == 0) launch(b);
    }));
    hooks.emplace_back(std::move(accumulator), key);
  }
  backward();
  last_backward_end_s_ = MonotonicSeconds();
  for (auto& [accumulator, key] : hooks) accumulator->del_post_hook(key);
  // Buckets whose parameters took no part in this backward go now.
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (!pending[b]) launch(static_cast<int>(b));
  }
  const double start = MonotonicSeconds();
  for (size_t b = 0; b < buckets.size(); ++b) {
    waiting_for_.store(kWaitingForReplicas, std::memory_order_relaxed);
    absl::Status waited = pending[b]->Wait(deadline);
    waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
    PT_RETURN_IF_ERROR(waited);
    launched[b].end_s = MonotonicSeconds();
    Keep(stats_.allreduces, launched[b], config_.history.allreduces);
  }
  step_allreduce_s_ += MonotonicSeconds() - start;  // the part not hidden by the backward
  reduced_steps_.insert(t);
  return absl::OkStatus();
}

}  // namespace pipetrain::executor
