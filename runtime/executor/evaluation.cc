// StageExecutor's evaluation on held-out data (stage_executor.h): forward-only passes of the
// evaluated micro-batches through the rank's model stages at a boundary.
#include <algorithm>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/base/status_macros.h"
#include "runtime/executor/stage_executor.h"

namespace pipetrain::executor {

using transport::MessageKind;

absl::StatusOr<std::optional<EvalRecord>> StageExecutor::Evaluate(int64_t n, ActionRecord& record) {
  const int64_t round = n / config_.eval_every - 1;  // evaluations before this one
  at::NoGradGuard no_grad;
  // Every chunk's newest weights in evaluation mode, put back in training mode on the way out
  // whatever happens.
  std::vector<model::StageModule*> modules;
  for (Chunk& chunk : chunks_) {
    model::StageModule& module = chunk.weights->MutableNewest();
    module.SetTraining(false);
    module.weight_gradients().set_splits(false);
    modules.push_back(&module);
  }
  struct Restore {
    const std::vector<model::StageModule*>& modules;
    bool splits;
    ~Restore() {
      for (model::StageModule* m : modules) {
        m->SetTraining(true);
        m->weight_gradients().set_splits(splits);
      }
    }
  } restore{modules, schedule::SplitsBackward(config_.schedule.kind)};

  // The flow control (the file comment of stage_executor.h): the rank that sent a chunk its
  // input hears when the chunk has run it; one that sends across a boundary waits for the
  // other side to have run all but the last kEvalWindow it sent.
  const at::Tensor ran = at::ones({1}, at::TensorOptions().dtype(at::kLong).device(device_));
  const transport::TensorSpec ran_spec = transport::SpecOf(ran);
  const auto await_progress = [&](const Chunk& chunk, int64_t k) -> absl::Status {
    const int next = chunk.stage + 1;
    const int64_t e = round * config_.eval_batches + k;
    absl::Status s = Receive(layout_.RankOf(next), MessageKind::kEvalProgress,
                             MessageKey(chunk.stage, e), e, ran_spec, record)
                         .status();
    if (s.ok()) return s;
    return absl::Status(
        s.code(), absl::StrCat("evaluation before step ", n, ": model stage ", next, " (rank ",
                               layout_.RankOf(next), ") did not run held-out micro-batch ", k,
                               " of ", config_.eval_batches, " within timeout_s (",
                               absl::FormatDuration(config_.recv_timeout), "): ", s.message()));
  };
  const auto sends_on = [&](const Chunk& chunk) {
    return !chunk.last && layout_.RankOf(chunk.stage + 1) != config_.stage;
  };
  double loss_sum = 0, correct = 0, targets_seen = 0;
  bool last = false;
  for (int64_t k = 0; k < config_.eval_batches; ++k) {
    const int64_t e = round * config_.eval_batches + k;  // this micro-batch's number
    at::Tensor handed;  // the output of the previous model stage, when on this rank
    for (size_t c = 0; c < chunks_.size(); ++c) {
      Chunk& chunk = chunks_[c];
      at::Tensor x;
      if (chunk.first) {
        PT_ASSIGN_OR_RETURN(x, config_.eval_inputs(k));
      } else if (layout_.RankOf(chunk.stage - 1) == config_.stage) {
        x = std::move(handed);
      } else {
        PT_ASSIGN_OR_RETURN(
            x, Receive(layout_.RankOf(chunk.stage - 1), MessageKind::kEvalActivation,
                       MessageKey(chunk.stage - 1, e), e,
                       config_.boundaries.at(static_cast<size_t>(chunk.stage)), record));
      }
      model::LayerContext ctx;
      ctx.micro_batch = e;
      ctx.mini_batch = n;
      ctx.seed = config_.seed;
      at::Tensor out = modules[c]->Forward(x, ctx);
      if (!chunk.first && layout_.RankOf(chunk.stage - 1) != config_.stage) {
        // Run: the rank it came from may send one more.
        PT_RETURN_IF_ERROR(transport_->Send(layout_.RankOf(chunk.stage - 1),
                                            MessageKind::kEvalProgress,
                                            MessageKey(chunk.stage - 1, e), ran));
      }
      const at::ScalarType compute = modules[c]->compute_dtype();
      if (chunk.last) {
        PT_ASSIGN_OR_RETURN(at::Tensor targets, config_.eval_targets(k));
        if (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf) {
          out = out.to(at::kFloat);
        }
        const at::Tensor logits = out.reshape({-1, out.size(-1)});
        const at::Tensor flat = targets.reshape({-1});
        loss_sum += at::cross_entropy_loss(logits, flat).item<double>();
        correct += logits.argmax(-1).eq(flat).sum().item<double>();
        targets_seen += static_cast<double>(flat.numel());
        last = true;
        continue;
      }
      if (out.is_floating_point() && out.scalar_type() != compute && compute == at::kBFloat16) {
        out = out.to(compute);  // mixed precision: activations travel in bfloat16
      }
      if (layout_.RankOf(chunk.stage + 1) == config_.stage) {
        handed = out;
      } else {
        if (k >= kEvalWindow) PT_RETURN_IF_ERROR(await_progress(chunk, k - kEvalWindow));
        PT_RETURN_IF_ERROR(transport_->Send(layout_.RankOf(chunk.stage + 1),
                                            MessageKind::kEvalActivation,
                                            MessageKey(chunk.stage, e), out));
      }
    }
  }
  // Every micro-batch sent on has been run on the other side before this rank goes on.
  for (const Chunk& chunk : chunks_) {
    if (!sends_on(chunk)) continue;
    for (int64_t k = std::max<int64_t>(0, config_.eval_batches - kEvalWindow);
         k < config_.eval_batches; ++k) {
      PT_RETURN_IF_ERROR(await_progress(chunk, k));
    }
  }
  if (!last) return std::optional<EvalRecord>();
  EvalRecord result;
  result.loss = loss_sum / static_cast<double>(config_.eval_batches);
  result.accuracy = targets_seen > 0 ? correct / targets_seen : 0.0;
  return std::optional<EvalRecord>(result);
}

}  // namespace pipetrain::executor
