#include "runtime/executor/stage_executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::executor {

using schedule::Action;
using schedule::ActionKind;
using transport::MessageKind;

StageExecutor::StageExecutor(StageConfig config, weights::WeightStore* weights,
                             transport::Transport* transport,
                             std::function<void(const StepRecord&)> on_step)
    : config_(std::move(config)),
      weights_(weights),
      transport_(transport),
      on_step_(std::move(on_step)),
      is_first_(config_.stage == 0),
      is_last_(config_.stage == config_.num_stages - 1) {
  stats_.records.reserve(config_.actions.size());
  if (config_.replicas > 1) {
    weights_->set_gradient_hook([this](int64_t, std::vector<at::Tensor>& grads) {
      const double start = MonotonicSeconds();
      absl::Status s = transport_->AllReduceMean(grads, absl::Now() + config_.recv_timeout);
      step_allreduce_s_ += MonotonicSeconds() - start;
      return s;
    });
  }
}

std::string StageExecutor::Where(const Action& action) const {
  return absl::StrCat("stage ", config_.stage, " ", schedule::ToString(action));
}

absl::Status StageExecutor::Run() {
  if (is_first_ && !config_.inputs) return absl::InvalidArgumentError("stage 0 has no inputs");
  if (is_last_ && !config_.targets) {
    return absl::InvalidArgumentError("the last stage has no targets");
  }
  NoteLiveVersions();
  for (const Action& action : config_.actions) {
    ActionRecord record;
    record.action = action;
    record.start_s = MonotonicSeconds();
    absl::Status status;
    try {
      status = Execute(action, record);
    } catch (const std::exception& e) {
      std::string what = e.what();
      status = absl::InternalError(what.substr(0, what.find("\nException raised from")));
    }
    record.end_s = MonotonicSeconds();
    if (!status.ok()) {
      stopped_at_ = action;
      // Errors from peers already name their origin; our own get our position.
      absl::Status annotated =
          absl::IsCancelled(status) || absl::IsAborted(status)
              ? status
              : absl::Status(status.code(), absl::StrCat(Where(action), ": ", status.message()));
      transport_->Abort(absl::AbortedError(absl::StrCat("aborted: ", annotated.message())));
      return annotated;
    }
    stats_.wait_s += record.wait_s;
    stats_.compute_s += (record.end_s - record.start_s) - record.wait_s;
    stats_.records.push_back(record);
  }
  // Messages still in flight must leave before this stage may report success (and its
  // process exit).
  if (absl::Status s = transport_->Flush(absl::Now() + config_.recv_timeout); !s.ok()) {
    transport_->Abort(s);
    return s;
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::Execute(const Action& action, ActionRecord& record) {
  const int64_t j = action.index;
  switch (action.kind) {
    case ActionKind::kForward:
      return Forward(j, record);
    case ActionKind::kBackward:
      return Backward(j, record);
    case ActionKind::kRecvActivation: {
      PT_ASSIGN_OR_RETURN(at::Tensor x, Receive(config_.stage - 1, MessageKind::kActivation, j,
                                                config_.expected_input, record));
      if (x.is_floating_point()) x.requires_grad_(true);
      received_activations_[j] = std::move(x);
      return absl::OkStatus();
    }
    case ActionKind::kRecvGradient: {
      PT_ASSIGN_OR_RETURN(at::Tensor g, Receive(config_.stage + 1, MessageKind::kGradient, j,
                                                config_.expected_output_grad, record));
      received_gradients_[j] = std::move(g);
      return absl::OkStatus();
    }
    case ActionKind::kSendActivation: {
      auto it = stash_.find(j);
      if (it == stash_.end()) return absl::InternalError("no output to send: F not run");
      return transport_->Send(config_.stage + 1, MessageKind::kActivation, j,
                              it->second.output.detach());
    }
    case ActionKind::kSendGradient: {
      auto it = input_gradients_.find(j);
      if (it == input_gradients_.end()) {
        return absl::InternalError("no input gradient to send: B not run");
      }
      at::Tensor g = std::move(it->second);
      input_gradients_.erase(it);
      return transport_->Send(config_.stage - 1, MessageKind::kGradient, j, g);
    }
    case ActionKind::kOptimizerStep: {
      step_allreduce_s_ = 0;
      PT_RETURN_IF_ERROR(weights_->Update(j));
      StepRecord step;
      step.step = j;
      step.end_s = MonotonicSeconds();
      step.allreduce_s = step_allreduce_s_;
      stats_.allreduce_s += step_allreduce_s_;
      if (is_last_) {
        step.mean_loss = step_loss_sum_[j] / config_.micro_batches;
        step_loss_sum_.erase(j);
      }
      stats_.steps.push_back(step);
      NoteLiveVersions();
      if (on_step_) on_step_(step);
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown action");
}

absl::Status StageExecutor::Forward(int64_t j, ActionRecord& record) {
  Stashed stashed;
  if (is_first_) {
    PT_ASSIGN_OR_RETURN(stashed.input, config_.inputs(j));
  } else {
    auto it = received_activations_.find(j);
    if (it == received_activations_.end()) {
      return absl::InternalError("input activation was never received");
    }
    stashed.input = std::move(it->second);
    received_activations_.erase(it);
  }
  stashed.version = weights_->VersionFor(j);
  record.version = stashed.version;
  PT_ASSIGN_OR_RETURN(model::StageModule * module, weights_->ModuleFor(j));
  model::LayerContext ctx;
  ctx.micro_batch = j;
  ctx.mini_batch = j / config_.micro_batches;
  ctx.seed = config_.seed;
  at::Tensor out = module->Forward(stashed.input, ctx);
  if (is_last_) {
    PT_ASSIGN_OR_RETURN(at::Tensor targets, config_.targets(j));
    at::Tensor loss =
        at::cross_entropy_loss(out.reshape({-1, out.size(-1)}), targets.reshape({-1}));
    step_loss_sum_[ctx.mini_batch] += loss.item<double>();
    out = loss * (1.0 / config_.micro_batches);
  }
  stashed.output = std::move(out);
  stash_.emplace(j, std::move(stashed));
  stats_.peak_stashed_microbatches =
      std::max(stats_.peak_stashed_microbatches, static_cast<int>(stash_.size()));
  NoteLiveVersions();
  return absl::OkStatus();
}

absl::Status StageExecutor::Backward(int64_t j, ActionRecord& record) {
  auto it = stash_.find(j);
  if (it == stash_.end()) return absl::InternalError("backward without forward");
  Stashed& stashed = it->second;
  record.version = stashed.version;
  if (is_last_) {
    torch::autograd::backward({stashed.output});
  } else {
    auto g = received_gradients_.find(j);
    if (g == received_gradients_.end()) {
      return absl::InternalError("output gradient was never received");
    }
    torch::autograd::backward({stashed.output}, {g->second});
    received_gradients_.erase(g);
  }
  if (!is_first_) {
    at::Tensor grad = stashed.input.grad();
    if (!grad.defined()) grad = at::zeros_like(stashed.input);
    input_gradients_[j] = grad;
  }
  stash_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> StageExecutor::Receive(int peer, MessageKind kind, int64_t j,
                                                  const transport::TensorSpec& expected,
                                                  ActionRecord& record) {
  const double start = MonotonicSeconds();
  absl::StatusOr<at::Tensor> got =
      transport_->Recv(peer, kind, j, absl::Now() + config_.recv_timeout);
  record.wait_s += MonotonicSeconds() - start;
  if (!got.ok()) return got.status();
  if (!transport::Matches(expected, *got)) {
    // Run() prefixes the stage and action.
    return absl::InvalidArgumentError(absl::StrCat(
        transport::MessageKindName(kind), " of micro-batch ", j, " from stage ", peer,
        " has the wrong shape or dtype: expected ", expected.ToString(), ", got ",
        transport::SpecOf(*got).ToString()));
  }
  return got;
}

void StageExecutor::NoteLiveVersions() {
  std::set<int64_t> live = {weights_->newest_version()};
  for (const auto& [j, stashed] : stash_) live.insert(stashed.version);
  stats_.peak_weight_versions =
      std::max(stats_.peak_weight_versions, static_cast<int>(live.size()));
}

}  // namespace pipetrain::executor
