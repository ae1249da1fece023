#include "runtime/executor/stage_executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::executor {

using schedule::Action;
using schedule::ActionKind;
using transport::MessageKind;

StageExecutor::StageExecutor(StageConfig config, std::vector<weights::WeightStore*> weights,
                             transport::Transport* transport,
                             std::function<void(const StepRecord&)> on_step)
    : config_(std::move(config)),
      layout_(schedule::LayoutOf(config_.schedule)),
      transport_(transport),
      on_step_(std::move(on_step)),
      is_first_(config_.stage == 0) {
  commit_.next_step = config_.schedule.first_step;
  consecutive_skips_ = std::max(0, config_.skipped_in_a_row);
  const std::vector<int> stages = layout_.StagesOf(config_.stage);
  const int last = layout_.stages() - 1;
  for (size_t c = 0; c < weights.size(); ++c) {
    Chunk chunk;
    // A list of one stage a rank: the rank's own (its place in the pipeline).
    chunk.stage = c < stages.size() ? stages[c] : config_.stage;
    chunk.weights = weights[c];
    chunk.first = chunk.stage == 0;
    chunk.last = chunk.stage == last;
    chunks_.push_back(std::move(chunk));
  }
  if (!chunks_.empty()) {
    const std::vector<at::Tensor> params = chunks_[0].weights->Newest().Parameters();
    if (!params.empty()) device_ = params[0].device();
  }
  for (const Chunk& chunk : chunks_) {
    shares_parameters_ = shares_parameters_ || chunk.weights->Newest().shares_parameters();
  }
  for (const TiedParameter& tie : config_.tied) {
    for (size_t k = 1; k < tie.copies.size(); ++k) {
      if (tie.copies[k].rank == config_.stage) {
        uncounted_copies_.insert({tie.copies[k].stage, tie.copies[k].parameter});
      }
    }
  }
}

StageActivity StageExecutor::Activity() const {
  StageActivity activity;
  activity.stashed_microbatches = stashed_now_.load(std::memory_order_relaxed);
  activity.live_weight_versions = live_versions_now_.load(std::memory_order_relaxed);
  const int64_t running = running_action_.load(std::memory_order_relaxed);
  if (running < 0) return activity;
  activity.action = schedule::ToString({static_cast<ActionKind>(running % 8), running / 8,
                                        running_stage_.load(std::memory_order_relaxed)});
  const int waiting = waiting_for_.load(std::memory_order_relaxed);
  if (waiting == kWaitingForReplicas) {
    activity.waiting_for = "replicas";
  } else if (waiting == kWaitingForPipeline) {
    activity.waiting_for = "pipeline";
  } else if (waiting >= 0) {
    activity.waiting_for = absl::StrCat("stage ", waiting);
  }
  return activity;
}

void StageExecutor::Stop(const absl::Status& reason) {
  {
    absl::MutexLock lock(&stop_mu_);
    if (stop_reason_.ok()) stop_reason_ = reason;
  }
  stop_requested_.store(true, std::memory_order_release);
  transport_->Abort(reason);
}

std::string StageExecutor::Where(const Action& action) const {
  if (action.stage != schedule::kOwnStage) {
    return absl::StrCat("rank ", config_.stage, " ", schedule::ToString(action));
  }
  return absl::StrCat("stage ", config_.stage, " ", schedule::ToString(action));
}

StageExecutor::Chunk& StageExecutor::ChunkOf(int stage) {
  if (stage != schedule::kOwnStage) {
    for (Chunk& chunk : chunks_) {
      if (chunk.stage == stage) return chunk;
    }
  }
  return chunks_[0];
}

int64_t StageExecutor::MessageKey(int lower, int64_t j) const {
  return layout_.MessageNumber(lower, j);
}

absl::Status StageExecutor::Run() {
  if (chunks_.empty() || chunks_.size() != static_cast<size_t>(layout_.chunks_per_rank)) {
    return absl::InvalidArgumentError(absl::StrCat("the rank runs ", layout_.chunks_per_rank,
                                                   " model stages; given the weights of ",
                                                   chunks_.size()));
  }
  if (static_cast<int>(config_.boundaries.size()) != layout_.stages() + 1) {
    return absl::InvalidArgumentError(absl::StrCat("the shapes of ", layout_.stages() + 1,
                                                   " stage boundaries are needed, got ",
                                                   config_.boundaries.size()));
  }
  for (const Chunk& chunk : chunks_) {
    if (chunk.first && !config_.inputs) {
      return absl::InvalidArgumentError("stage 0 has no inputs");
    }
    if (chunk.last && !config_.targets) {
      return absl::InvalidArgumentError("the last stage has no targets");
    }
  }
  PT_ASSIGN_OR_RETURN(schedule::StageActionStream actions,
                      schedule::StageActionStream::Create(config_.schedule, config_.stage));
  actions_ = std::make_unique<schedule::StageActionStream>(std::move(actions));
  // The first boundary is sealed from the start (no command can reach it); the checkpoint
  // policy still applies there. Those before the first that an update seals are sealed now.
  if (const int64_t n = config_.schedule.first_step + 1;
      is_first_ && n < config_.schedule.steps && PolicyCommands(n) != 0) {
    PT_RETURN_IF_ERROR(ApplyBoundary(n, PolicyCommands(n)));
  }
  for (int64_t n = config_.schedule.first_step + 2;
       is_first_ && n < config_.schedule.first_step + SealLead() && n < config_.schedule.steps;
       ++n) {
    PT_RETURN_IF_ERROR(SealBoundary(n));
  }
  NoteLiveVersions();
  for (; !actions_->done(); actions_->Advance()) {
    const Action action = actions_->current();  // step commands may rewrite what follows
    running_stage_.store(action.stage, std::memory_order_relaxed);
    running_action_.store(action.index * 8 + static_cast<int64_t>(action.kind),
                          std::memory_order_relaxed);
    ActionRecord record;
    record.action = action;
    record.start_s = MonotonicSeconds();
    absl::Status status;
    if (stop_requested_.load(std::memory_order_acquire)) {
      absl::MutexLock lock(&stop_mu_);
      status = stop_reason_;
    }
    try {
      if (status.ok()) status = Execute(action, record);
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
    Keep(stats_.records, record, config_.history.actions);
    if (config_.on_action) config_.on_action(record);
  }
  running_action_.store(-1, std::memory_order_relaxed);
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
  if (action.kind == ActionKind::kOptimizerStep) return Optimize(j, record);
  Chunk& chunk = ChunkOf(action.stage);
  const int s = chunk.stage;
  switch (action.kind) {
    case ActionKind::kForward: return Forward(chunk, j, record);
    case ActionKind::kBackward:
      PT_RETURN_IF_ERROR(Backward(chunk, j, action.kind, record));
      GradientDone(chunk, j);
      return absl::OkStatus();
    case ActionKind::kInputGradient: return Backward(chunk, j, action.kind, record);
    case ActionKind::kWeightGradient:
      PT_RETURN_IF_ERROR(WeightGradient(chunk, j));
      GradientDone(chunk, j);
      return absl::OkStatus();
    case ActionKind::kRecvActivation:  // right before the F that uses it (communication.h)
      return ReceiveActivation(chunk, j, record);
    case ActionKind::kRecvGradient:  // right before the backward that uses it
      return ReceiveGradient(chunk, j, record);
    case ActionKind::kSendActivation: {
      auto it = chunk.stash.find(j);
      if (it == chunk.stash.end()) return absl::InternalError("no output to send: F not run");
      const at::Tensor& out = it->second.output;
      const int to = layout_.RankOf(s + 1);
      PT_RETURN_IF_ERROR(
          transport_->Send(to, MessageKind::kActivation, MessageKey(s, j), out.detach()));
      record.bytes += out.numel() * static_cast<int64_t>(out.element_size());
      if (config_.vertical_sync) {  // the version the micro-batch runs on, on every stage
        PT_RETURN_IF_ERROR(
            transport_->Send(to, MessageKind::kWeightVersion, j,
                             at::full({1}, it->second.version,
                                      at::TensorOptions().dtype(at::kLong).device(out.device()))));
      }
      if (!CarriesBoundary(s, j)) return absl::OkStatus();
      const int64_t t = j / config_.micro_batches;
      const at::Tensor commands =
          at::full({1}, static_cast<int64_t>(boundary_commands_[t + 1]),
                   at::TensorOptions().dtype(at::kLong).device(it->second.output.device()));
      return transport_->Send(to, MessageKind::kControl, MessageKey(s, t), commands);
    }
    case ActionKind::kSendGradient: {
      auto it = chunk.input_grads.find(j);
      if (it == chunk.input_grads.end()) {
        return absl::InternalError("no input gradient to send: B not run");
      }
      at::Tensor g = std::move(it->second);
      chunk.input_grads.erase(it);
      record.bytes += g.numel() * static_cast<int64_t>(g.element_size());
      return transport_->Send(layout_.RankOf(s - 1), MessageKind::kGradient, MessageKey(s - 1, j),
                              g);
    }
    case ActionKind::kOptimizerStep: break;  // above
  }
  return absl::InternalError("unknown action");
}

absl::Status StageExecutor::ReceiveActivation(Chunk& chunk, int64_t j, ActionRecord& record) {
  const int s = chunk.stage, from = layout_.RankOf(s - 1);
  PT_ASSIGN_OR_RETURN(at::Tensor x, Receive(from, MessageKind::kActivation, MessageKey(s - 1, j), j,
                                            config_.boundaries[s], record));
  record.bytes += x.numel() * static_cast<int64_t>(x.element_size());
  if (x.is_floating_point()) x.requires_grad_(true);
  chunk.activations[j] = std::move(x);
  if (config_.vertical_sync) {
    PT_ASSIGN_OR_RETURN(at::Tensor v,
                        Receive(from, MessageKind::kWeightVersion, j, j, {{1}, at::kLong}, record));
    chunk.given_versions[j] = v.cpu().item<int64_t>();
  }
  if (!CarriesBoundary(s - 1, j)) return absl::OkStatus();
  const int64_t t = j / config_.micro_batches;
  PT_ASSIGN_OR_RETURN(at::Tensor c, Receive(from, MessageKind::kControl, MessageKey(s - 1, t), t,
                                            {{1}, at::kLong}, record));
  return ApplyBoundary(t + 1, static_cast<uint32_t>(c.cpu().item<int64_t>()));
}

absl::Status StageExecutor::ReceiveGradient(Chunk& chunk, int64_t j, ActionRecord& record) {
  const int s = chunk.stage;
  PT_ASSIGN_OR_RETURN(at::Tensor g,
                      Receive(layout_.RankOf(s + 1), MessageKind::kGradient, MessageKey(s, j), j,
                              config_.boundaries[s + 1], record));
  record.bytes += g.numel() * static_cast<int64_t>(g.element_size());
  chunk.output_grads[j] = std::move(g);
  return absl::OkStatus();
}

absl::Status StageExecutor::Optimize(int64_t j, ActionRecord& record) {
  StepRecord step;
  step.step = j;
  // Every W of the step is done (schedules with chunks flush: so is every backward).
  const bool flushes = schedule::HoldsChunks(config_.schedule.kind);
  for (Chunk& chunk : chunks_) {
    if (!chunk.owed_w.empty() || (flushes && !chunk.stash.empty())) {
      return absl::InternalError(absl::StrCat(
          "stage ", chunk.stage, " reached its update of step ", j, " with ", chunk.owed_w.size(),
          " W's and ", flushes ? chunk.stash.size() : 0, " backwards not run"));
    }
  }
  // Each stage's gradient averaged over its replicas, then tied copies' summed: what every
  // copy of every parameter is updated with.
  FoldSharedGradients();
  for (Chunk& chunk : chunks_) PT_RETURN_IF_ERROR(ReduceGradients(chunk, j));
  PT_RETURN_IF_ERROR(SumTiedGradients(j, record));
  if (config_.clip_grad_norm > 0) {
    PT_ASSIGN_OR_RETURN(step.grad_norm, ClipGradients(j, record));
  }
  if (config_.commit_steps && config_.replicas > 1) PT_RETURN_IF_ERROR(CommitStep(j, record));
  if (auto loss = job_losses_.find(j); loss != job_losses_.end()) {
    step.job_loss = loss->second;
    job_losses_.erase(loss);
  }
  for (Chunk& chunk : chunks_) {
    PT_RETURN_IF_ERROR(chunk.weights->Update(j));
    step.skipped = step.skipped || chunk.weights->last_update_skipped();
  }
  commit_ = {j + 1, -1, std::nullopt};
  if (step.skipped) {
    ++stats_.skipped_steps;
    ++consecutive_skips_;
  } else {
    consecutive_skips_ = 0;
  }
  step.end_s = MonotonicSeconds();
  step.allreduce_s = step_allreduce_s_;
  step.last_backward_end_s = last_backward_end_s_;
  step.compute_s = stats_.compute_s;
  step.wait_s = stats_.wait_s;
  stats_.allreduce_s += step_allreduce_s_;
  step_allreduce_s_ = 0;
  if (std::any_of(chunks_.begin(), chunks_.end(), [](const Chunk& c) { return c.last; })) {
    step.mean_loss = step_loss_sum_[j] / config_.micro_batches;
    step_loss_sum_.erase(j);
  }
  if (auto c = boundary_commands_.find(j + 1); c != boundary_commands_.end()) {
    step.commands_after = c->second;
  }
  if (config_.checkpoint_every > 0 && j + 1 == config_.schedule.steps) {
    // The job's end: a checkpoint policy writes one after the last step too (what a longer
    // job's resume_from continues from). Every update is done; nothing is in flight.
    step.commands_after |= control::kCheckpoint;
  }
  if (config_.eval_every > 0 && (j + 1) % config_.eval_every == 0) {
    PT_ASSIGN_OR_RETURN(step.eval, Evaluate(j + 1, record));
  }
  // Boundaries up to j + 1 have been passed on (SEND_ACT precedes this STEP).
  boundary_commands_.erase(boundary_commands_.begin(), boundary_commands_.upper_bound(j + 1));
  Keep(stats_.steps, step, config_.history.steps);
  NoteLiveVersions();
  if (is_first_ && j + SealLead() < actions_->params().steps) {
    PT_RETURN_IF_ERROR(SealBoundary(j + SealLead()));
  }
  if (on_step_) on_step_(step);
  // After its report: the step that reaches the limit is one of the steps reported skipped.
  if (step.skipped && consecutive_skips_ >= config_.nonfinite_limit) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the loss or the gradients were not finite in ", consecutive_skips_, " consecutive steps (",
        j - consecutive_skips_ + 1, " to ", j,
        "; each was skipped): the job stops here (nonfinite_limit ", config_.nonfinite_limit, ")"));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::Forward(Chunk& chunk, int64_t j, ActionRecord& record) {
  Stashed stashed;
  if (chunk.first) {
    PT_ASSIGN_OR_RETURN(stashed.input, config_.inputs(j));
  } else {
    auto it = chunk.activations.find(j);
    if (it == chunk.activations.end()) {
      return absl::InternalError("input activation was never received");
    }
    stashed.input = std::move(it->second);
    chunk.activations.erase(it);
    if (auto v = chunk.given_versions.find(j); v != chunk.given_versions.end()) {
      PT_RETURN_IF_ERROR(chunk.weights->RunOn(j, v->second));
      chunk.given_versions.erase(v);
    }
  }
  stashed.version = chunk.weights->VersionFor(j);
  record.version = stashed.version;
  PT_ASSIGN_OR_RETURN(model::StageModule * module, chunk.weights->ModuleFor(j));
  // Under I and W, the operations without a deferring kernel take the generic path.
  module->weight_gradients().set_splits(schedule::SplitsBackward(config_.schedule.kind));
  model::LayerContext ctx;
  const int64_t m = config_.micro_batches;
  ctx.micro_batch = (j / m) * (config_.replicas * m) + config_.replica * m + j % m;
  ctx.mini_batch = j / m;
  ctx.seed = config_.seed;
  at::Tensor out = module->Forward(stashed.input, ctx);
  const at::ScalarType compute = module->compute_dtype();
  if (!chunk.last && out.is_floating_point() && out.scalar_type() != compute &&
      compute == at::kBFloat16) {
    out = out.to(compute);  // mixed precision: activations travel in bfloat16
  }
  if (chunk.last) {
    PT_ASSIGN_OR_RETURN(at::Tensor targets, config_.targets(j));
    if (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf) {
      out = out.to(at::kFloat);  // the loss in float32
    }
    at::Tensor loss =
        at::cross_entropy_loss(out.reshape({-1, out.size(-1)}), targets.reshape({-1}));
    step_loss_sum_[ctx.mini_batch] += loss.item<double>();
    out = loss * (1.0 / config_.micro_batches);
  } else if (layout_.RankOf(chunk.stage + 1) == config_.stage) {
    // The next stage is on this rank: its input, handed over in place.
    at::Tensor next = out.detach();
    if (next.is_floating_point()) next.requires_grad_(true);
    ChunkOf(chunk.stage + 1).activations[j] = std::move(next);
  }
  stashed.output = std::move(out);
  chunk.stash.emplace(j, std::move(stashed));
  NoteLiveVersions();
  return absl::OkStatus();
}

absl::Status StageExecutor::Backward(Chunk& chunk, int64_t j, ActionKind kind,
                                     ActionRecord& record) {
  const bool split = kind == ActionKind::kInputGradient;
  auto it = chunk.stash.find(j);
  if (it == chunk.stash.end()) return absl::InternalError("backward without forward");
  Stashed& stashed = it->second;
  record.version = stashed.version;
  at::Tensor output_grad;
  if (!chunk.last) {
    auto g = chunk.output_grads.find(j);
    if (g == chunk.output_grads.end()) {
      return absl::InternalError("output gradient was never received");
    }
    output_grad = std::move(g->second);
    chunk.output_grads.erase(g);
  }
  auto backward = [&] {
    if (chunk.last) {
      torch::autograd::backward({stashed.output});
    } else {
      torch::autograd::backward({stashed.output}, {output_grad});
    }
  };
  const bool final_of_step = j % config_.micro_batches == config_.micro_batches - 1;
  if (split) {
    PT_ASSIGN_OR_RETURN(model::StageModule * module, chunk.weights->ModuleFor(j));
    model::DeferWeightGradients deferred(module->weight_gradients(), chunk.owed_w[j]);
    backward();
    last_backward_end_s_ = MonotonicSeconds();
  } else if (chunk.first && config_.replicas > 1 && config_.overlap_allreduce && final_of_step &&
             !shares_parameters_ && !schedule::HoldsChunks(config_.schedule.kind) &&
             schedule::WeightsOf(config_.schedule.kind) != schedule::WeightPolicy::kStashed) {
    // Hippie's buckets (one module holds the step's gradient: not PipeDream's versions, nor a
    // shared parameter's, whose gradient is folded into its owner's after the backward).
    PT_ASSIGN_OR_RETURN(model::StageModule * module, chunk.weights->ModuleFor(j));
    PT_RETURN_IF_ERROR(ReduceStepLoss(chunk, j / config_.micro_batches));  // one stage: last
    PT_RETURN_IF_ERROR(BackwardWithBucketedAllReduce(j, *module, backward));
  } else {
    backward();
    last_backward_end_s_ = MonotonicSeconds();
  }
  if (!chunk.first) {
    at::Tensor grad = stashed.input.grad();
    if (!grad.defined()) grad = at::zeros_like(stashed.input);
    if (layout_.RankOf(chunk.stage - 1) == config_.stage) {
      // The previous stage is on this rank: its output gradient, handed over in place.
      ChunkOf(chunk.stage - 1).output_grads[j] = grad;
    } else {
      chunk.input_grads[j] = grad;
    }
  }
  chunk.stash.erase(it);
  NoteLiveVersions();
  return absl::OkStatus();
}

absl::Status StageExecutor::WeightGradient(Chunk& chunk, int64_t j) {
  auto owed = chunk.owed_w.find(j);
  if (owed == chunk.owed_w.end()) return absl::InternalError("W without its I");
  owed->second.Run();
  last_backward_end_s_ = MonotonicSeconds();
  chunk.owed_w.erase(owed);
  return absl::OkStatus();
}

absl::Status StageExecutor::AwaitCollective(
    const transport::Group& group, ActionRecord& record,
    absl::FunctionRef<absl::Status(absl::Time deadline)> collective) {
  const double start = MonotonicSeconds();
  waiting_for_.store(group.replicas() ? kWaitingForReplicas : kWaitingForPipeline,
                     std::memory_order_relaxed);
  absl::Status s = collective(absl::Now() + config_.recv_timeout);
  waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
  record.wait_s += MonotonicSeconds() - start;
  return s;
}

absl::StatusOr<at::Tensor> StageExecutor::Receive(int peer, MessageKind kind, int64_t key,
                                                  int64_t j, const transport::TensorSpec& expected,
                                                  ActionRecord& record) {
  const double start = MonotonicSeconds();
  waiting_for_.store(peer, std::memory_order_relaxed);
  absl::StatusOr<at::Tensor> got =
      transport_->Recv(peer, kind, key, absl::Now() + config_.recv_timeout);
  waiting_for_.store(kNotWaiting, std::memory_order_relaxed);
  record.wait_s += MonotonicSeconds() - start;
  if (!got.ok()) return got.status();
  if (!transport::Matches(expected, *got)) {
    // Run() prefixes the stage and action.
    return absl::InvalidArgumentError(
        absl::StrCat(transport::MessageKindName(kind), " of micro-batch ", j, " from stage ", peer,
                     " has the wrong shape or dtype: expected ", expected.ToString(), ", got ",
                     transport::SpecOf(*got).ToString()));
  }
  return got;
}

}  // namespace pipetrain::executor
