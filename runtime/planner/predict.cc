// The planners' one step simulation (predict.h): every rank's action list, one model stage a
// rank or several (the schedules with chunks), through one discrete-event loop.
#include "runtime/planner/predict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/planner/host_placement.h"
#include "runtime/schedule/chunked_schedule.h"

namespace pipetrain::planner {
namespace {

using schedule::Action;
using schedule::ActionKind;

constexpr double kNever = std::numeric_limits<double>::infinity();

// Steps simulated: the step time is the mean time between the STEPs of steps 1 .. 6, once
// the pipeline (2BW has no flush) is in its steady state and before the last one drains it.
constexpr int kSimulatedSteps = 8;

// One micro-batch on a stage: what it keeps from its forward to its backward, and the most
// the stage holds for it while that backward runs, with the step's gradient not yet there
// (the step's first backward, which allocates it layer by layer) or already there; and the
// same for the step's last backward of a stage that averages its gradient during it (the
// flat copies the AllReduce makes of the gradient, counted as each piece finishes: at most
// what its buckets, each copied once all its gradients are done, hold).
// `recomputed`: what its recomputed layers stash again when its backward recomputes them;
// under a split backward it stays from I until W (the queued weight gradients hold it).
struct MicroBatchBytes {
  int64_t kept = 0;
  int64_t recomputed = 0;
  int64_t backward_first = 0;
  int64_t backward_later = 0;
  int64_t overlapped_first = 0;
  int64_t overlapped_later = 0;
};

// What a received message of `bytes` occupies (profile.h, inline_buffer_bytes).
int64_t ReceivedBytes(const ModelProfile& profile, int64_t bytes) {
  const int64_t inline_bytes = profile.inline_buffer_bytes;
  if (inline_bytes > 0 && 2 * bytes >= inline_bytes && bytes <= inline_bytes) {
    return inline_bytes;  // its header's few bytes aside
  }
  return bytes;
}

// One micro-batch's memory on the stage of layers [begin, end). Its forward keeps the
// received input and, per layer, what the layer stashes and its output; a run of recomputed
// layers keeps only the run's output. Its backward goes from the last layer to the first, a
// recomputed run as one piece: while a piece runs, the stage still holds what the micro-batch
// kept up to the piece's last layer, the piece's working memory (the profile's: its own
// allocations, the input's gradient included), for a run everything the recomputation
// stashes again, and the parameter gradients: in the step's first backward those of the
// pieces done so far and this one, later all of them.
MicroBatchBytes MicroBatchMemory(const ModelProfile& profile,
                                 const std::vector<LayerProfile>& layers, const Layout& layout,
                                 int begin, int end) {
  // kept_through[i]: what the micro-batch keeps from the stage's input through layer begin+i.
  std::vector<int64_t> kept_through(end - begin);
  int64_t kept = begin > 0 ? ReceivedBytes(profile, layers[begin - 1].output_bytes) : 0;
  int64_t gradient = 0;
  for (int l = begin; l < end; ++l) {
    const LayerProfile& layer = layers[l];
    if (!layout.recomputes(l)) {
      kept += layer.stash_bytes + layer.output_bytes;
    } else if (l + 1 == end || !layout.recomputes(l + 1)) {
      kept += layer.output_bytes;  // the run's output stays for the next layer
    }
    kept_through[l - begin] = kept;
    gradient += layer.parameter_bytes;
  }
  MicroBatchBytes m;
  m.kept = kept;
  for (int l = begin; l < end; ++l) {
    if (layout.recomputes(l)) m.recomputed += layers[l].stash_bytes + layers[l].output_bytes;
  }
  int64_t gradient_so_far = 0;
  for (int last = end - 1; last >= begin;) {
    int first = last;
    while (layout.recomputes(last) && first > begin && layout.recomputes(first - 1)) --first;
    int64_t working = 0, recomputed = 0;
    // The AllReduce's copies of the pieces done before this one (when it overlaps).
    const int64_t copied = gradient_so_far;
    for (int l = first; l <= last; ++l) {
      working = std::max(working, layers[l].working_bytes);
      gradient_so_far += layers[l].parameter_bytes;
      if (layout.recomputes(l)) recomputed += layers[l].stash_bytes + layers[l].output_bytes;
    }
    const int64_t held = kept_through[last - begin] + recomputed + working;
    m.backward_first = std::max(m.backward_first, held + gradient_so_far);
    m.backward_later = std::max(m.backward_later, held + gradient);
    m.overlapped_first = std::max(m.overlapped_first, held + gradient_so_far + copied);
    m.overlapped_later = std::max(m.overlapped_later, held + gradient + copied);
    last = first - 1;
  }
  return m;
}

// The speed, against one core of its own, at which each of `computing` things computing at
// once runs (ranks, and the transports' threads where the caller counts them), each of the
// `replicas` running the same: with `shared_cores` they share those cores equally, and k of
// them running at once are slowed by the profile's slowdown[k - 1]; 1 without shared cores.
double SharedCoreRate(const ModelProfile& profile, const ClusterProfile& cluster, int computing,
                      int replicas) {
  if (cluster.shared_cores <= 0 || computing <= 0) return 1.0;
  const int ranks = computing * replicas;
  const int running = std::min(ranks, cluster.shared_cores);
  double rate = static_cast<double>(running) / ranks;
  if (!profile.slowdown.empty()) {
    rate /= profile.slowdown[std::min<size_t>(running, profile.slowdown.size()) - 1];
  }
  return rate;
}

// The prediction's step time (the mean time between the STEPs `step_end` of steps 1 ..
// kSimulatedSteps − 2) and throughputs. InternalError when the simulation did not reach
// every STEP.
absl::Status SetStepTime(const ModelProfile& profile, const Layout& layout,
                         const std::vector<double>& step_end, Prediction& prediction) {
  if (step_end.size() != kSimulatedSteps) {
    return absl::InternalError("the simulation did not run every step");
  }
  prediction.step_time_s = (step_end[kSimulatedSteps - 2] - step_end[1]) / (kSimulatedSteps - 3);
  prediction.samples_per_s = layout.global_batch() / prediction.step_time_s;
  prediction.tokens_per_s =
      prediction.samples_per_s * static_cast<double>(profile.tokens_per_sample);
  return absl::OkStatus();
}

// One model stage's costs: a rank's one stage, or one of the chunks it holds.
struct StageCosts {
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  // The split backward (the kinds that SplitsBackward): I, the input gradient, and W, the
  // weight gradient; together the backward.
  double input_gradient_s = 0, weight_gradient_s = 0;
  // The gradient AllReduce of a step (w > 1): elapsed, its last bucket's alone, and the CPU
  // it takes from each rank (every bucket's fixed cost and the bytes).
  double allreduce_s = 0, last_bucket_allreduce_s = 0, allreduce_cpu_s = 0;
  double send_act_s = 0, send_grad_s = 0;  // link time of the stage's output / input gradient
  // CPU of the messages the stage sends (its output, its input's gradient) and receives.
  MessageCost act_out, grad_out, act_in, grad_in;
  int64_t parameter_bytes = 0;  // one version of its parameters, and so of their gradient
  int64_t optimizer_bytes = 0;
  MicroBatchBytes micro_batch;
};

// How a rank averages its gradients among replicas, as the executor does
// (runtime/executor/gradient_averaging.cc): not at all (w = 1); at its update; during the
// step's last backward, bucket by bucket (stage 0 of a schedule of one stage a rank, with the
// AllReduce overlapped, unless its weights are stashed: pipedream sums its versions' gradients
// at STEP); or each model stage's once its gradient is final (its last B or W of the step),
// one after another, waited for at STEP (the schedules with chunks). Either way the AllReduce
// works on a flat copy of the gradient.
enum class Averaging { kNone, kAtUpdate, kDuringLastBackward, kAfterLastGradient };

Averaging AveragingOf(const Layout& layout, int rank) {
  if (layout.pipeline.replicas <= 1) return Averaging::kNone;
  if (schedule::HoldsChunks(layout.schedule)) return Averaging::kAfterLastGradient;
  if (rank == 0 && layout.overlap_allreduce &&
      schedule::WeightsOf(layout.schedule) != schedule::WeightPolicy::kStashed) {
    return Averaging::kDuringLastBackward;
  }
  return Averaging::kAtUpdate;
}

// The model stage an action of rank `rank`'s list runs on.
int StageOf(const Action& a, int rank) { return a.stage == schedule::kOwnStage ? rank : a.stage; }

StageCosts CostsOf(const ModelProfile& profile, const ClusterProfile& cluster, const Layout& layout,
                   const std::vector<LayerProfile>& layers, const schedule::ChunkLayout& chunks,
                   int k) {
  const auto [begin, end] = layout.pipeline.stage_layers[k];
  const int rank = chunks.RankOf(k), w = layout.pipeline.replicas;
  StageCosts c;
  double weight_gradient = 0;
  for (int l = begin; l < end; ++l) {
    const LayerProfile& layer = layers[l];
    c.forward_s += layer.forward_s;
    c.backward_s += layer.backward_s + (layout.recomputes(l) ? layer.forward_s : 0);
    c.optimizer_s += layer.optimizer_s;
    c.parameter_bytes += layer.parameter_bytes;
    c.optimizer_bytes += layer.optimizer_bytes;
    // The weight gradient: as profiled (what the layer defers); where a profile has none, a
    // layer with parameters estimated: its products with the weights cost about its forward,
    // and never more than half its backward.
    if (layer.weight_gradient_s >= 0) {
      weight_gradient += layer.weight_gradient_s;
    } else if (layer.parameter_bytes > 0) {
      weight_gradient += std::min(layer.forward_s, 0.5 * layer.backward_s);
    }
  }
  // Model stage 0 has no input gradient: its I does nothing and its W the whole backward.
  // (Measured apart, W may come out above its backward by noise: it is never more.)
  c.weight_gradient_s = k == 0 ? c.backward_s : std::min(weight_gradient, c.backward_s);
  c.input_gradient_s = c.backward_s - c.weight_gradient_s;
  // Averaged bucket by bucket during the backward, each bucket is a collective of its own;
  // otherwise the whole gradient at once.
  const double parameter_bytes = static_cast<double>(c.parameter_bytes);
  const bool bucketed = AveragingOf(layout, rank) == Averaging::kDuringLastBackward;
  const int calls =
      bucketed ? std::max(1, static_cast<int>(std::ceil(parameter_bytes /
                                                        std::max<int64_t>(1, layout.bucket_bytes))))
               : 1;
  const bool ring_spans_hosts = ReplicasSpanHosts(layout, rank);
  c.allreduce_s = AllReduceSeconds(cluster, parameter_bytes, w, calls, ring_spans_hosts);
  c.last_bucket_allreduce_s = AllReduceSeconds(
      cluster, std::min<double>(parameter_bytes, static_cast<double>(layout.bucket_bytes)), w, 1,
      ring_spans_hosts);
  c.allreduce_cpu_s = AllReduceCpuSeconds(profile, parameter_bytes, w, calls);
  // A message's way between the ranks of model stages `lower` and lower + 1 (either
  // direction): between hosts on their link, its bandwidth shared by the replicas whose same
  // message crosses it at the same instant; within one as measured between busy ranks, else
  // the link's latency + bandwidth.
  const bool between_measured = cluster.between_hosts.bytes_per_s > 0;
  const auto way = [&](const MessageCost& cost, double bytes, int lower) {
    const int sharing = ReplicasSharingLink(layout, chunks.RankOf(lower), chunks.RankOf(lower + 1));
    if (sharing > 0 && between_measured) {
      const LinkProfile& between = cluster.between_hosts;
      return between.latency_s + sharing * bytes / between.bytes_per_s;
    }
    return cost.latency_s > 0 ? cost.latency_s : cluster.link.Seconds(bytes);
  };
  if (end < static_cast<int>(layers.size())) {
    const double bytes = static_cast<double>(layers[end - 1].output_bytes);
    c.act_out = c.grad_in = MessageCostAt(profile.message_costs, bytes);
    c.send_act_s = way(c.act_out, bytes, k);
  }
  if (begin > 0) {
    const double bytes = static_cast<double>(layers[begin - 1].output_bytes);
    c.grad_out = c.act_in = MessageCostAt(profile.message_costs, bytes);
    c.send_grad_s = way(c.grad_out, bytes, k - 1);
  }
  c.micro_batch = MicroBatchMemory(profile, layers, layout, begin, end);
  return c;
}

// For each action of rank `rank`'s list, whether it is its model stage's last gradient (B or
// W) before a STEP: where that stage's gradient is final.
std::vector<bool> LastGradientOfEachStep(const std::vector<Action>& list, int rank) {
  std::vector<bool> last_of_step(list.size(), false);
  std::map<int, size_t> last;  // model stage -> its latest B or W
  for (size_t i = 0; i < list.size(); ++i) {
    const ActionKind kind = list[i].kind;
    if (kind == ActionKind::kBackward || kind == ActionKind::kWeightGradient) {
      last[StageOf(list[i], rank)] = i;
    } else if (kind == ActionKind::kOptimizerStep) {
      for (const auto& [stage, at] : last) last_of_step[at] = true;
      last.clear();
    }
  }
  return last_of_step;
}

// The most rank `rank` holds at once of its micro-batches in flight, its model stages'
// gradients and the AllReduce's copies of them, walking its action list: each micro-batch
// keeps `kept` of its stage from its F to its B (or to its W after an I, with what the I
// recomputed added from the I on) and holds at most `backward_*` during its B, I or W (its
// stage's gradient included); a stage's gradient exists from its step's first B or W to the
// update (STEP drops it), and its flat copy while it is averaged (during the last backward,
// or at STEP for the gradients averaged whole). Also the most micro-batches in flight.
// `last_of_step`: LastGradientOfEachStep(list, rank).
std::pair<int64_t, int> HeldAtPeak(const std::vector<Action>& list, int rank,
                                   const std::vector<bool>& last_of_step,
                                   const std::vector<StageCosts>& costs, Averaging averaging) {
  int in_flight = 0, peak_in_flight = 0;
  std::map<int, bool> has_gradient;  // model stage -> its gradient exists
  int64_t held = 0, gradients = 0, peak = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::kOptimizerStep) {
      if ((averaging == Averaging::kAtUpdate || averaging == Averaging::kAfterLastGradient) &&
          gradients > 0) {
        peak = std::max(peak, held + 2 * gradients);
      }
      has_gradient.clear();
      gradients = 0;
      continue;
    }
    if (!schedule::IsCompute(a.kind)) continue;
    const int k = StageOf(a, rank);
    const StageCosts& c = costs[k];
    const MicroBatchBytes& m = c.micro_batch;
    if (a.kind == ActionKind::kForward) {
      held += m.kept;
      peak_in_flight = std::max(peak_in_flight, ++in_flight);
      peak = std::max(peak, held + gradients);
      continue;
    }
    const bool has = has_gradient[k];
    const int64_t others = held - m.kept;
    const int64_t other_gradients = gradients - (has ? c.parameter_bytes : 0);
    if (a.kind == ActionKind::kBackward && averaging == Averaging::kDuringLastBackward &&
        last_of_step[i]) {
      peak = std::max(peak,
                      others + other_gradients + (has ? m.overlapped_later : m.overlapped_first));
      // Its end: the micro-batch gone, the gradient and its copy before the average.
      peak = std::max(peak, others + other_gradients + 2 * c.parameter_bytes);
    } else {
      peak = std::max(peak, others + other_gradients + (has ? m.backward_later : m.backward_first));
    }
    if (a.kind == ActionKind::kInputGradient) {
      held += m.recomputed;  // until W
      peak = std::max(peak, held + gradients);
      continue;
    }
    held -= m.kept + (a.kind == ActionKind::kWeightGradient ? m.recomputed : 0);
    --in_flight;
    if (!has) {
      has_gradient[k] = true;
      gradients += c.parameter_bytes;
    }
  }
  return {peak, peak_in_flight};
}

absl::Status CheckLayout(const ModelProfile& profile, const ClusterProfile& cluster,
                         const Layout& layout, int layers) {
  if (profile.sizes.empty()) return absl::InvalidArgumentError("the profile has no measurements");
  if (layout.stages() < 1) return absl::InvalidArgumentError("a layout needs at least one stage");
  if (layout.virtual_stages < 1 || layout.stages() * layout.virtual_stages !=
                                       static_cast<int>(layout.pipeline.stage_layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a layout of ", layout.stages(), " stages",
        layout.virtual_stages == 1 ? "" : absl::StrCat(" (", layout.virtual_stages, " a rank)"),
        " has ", layout.pipeline.stage_layers.size(),
        " layer ranges (SetStageLayers, SetModelStageLayers)"));
  }
  int next = 0;
  for (const auto& [begin, end] : layout.pipeline.stage_layers) {
    if (begin != next || end <= begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ranges must be contiguous and non-empty from layer 0: got [", begin,
                       ", ", end, ") after layer ", next));
    }
    next = end;
  }
  if (next != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the stages cover ", next, " of the model's ", layers, " layers"));
  }
  const model::PipelineLayout& pipeline = layout.pipeline;
  if (pipeline.replicas < 1 || pipeline.micro_batch_size < 1 || pipeline.micro_batches < 1) {
    return absl::InvalidArgumentError("replicas, micro-batch size and count must be positive");
  }
  if (absl::Status s = CheckRankHosts(cluster, layout); !s.ok()) return s;
  schedule::ScheduleParams params{layout.schedule, layout.stages(), layout.pipeline.micro_batches,
                                  kSimulatedSteps};
  params.virtual_stages = layout.virtual_stages;
  return schedule::ValidateScheduleParams(params);
}

}  // namespace

int WeightVersions(schedule::ScheduleKind schedule, int stages, int stage, int micro_batches,
                   bool vertical_sync) {
  switch (schedule::WeightsOf(schedule)) {
    case schedule::WeightPolicy::kDoubleBuffered: return 2;
    case schedule::WeightPolicy::kStashed: {
      const int m = std::max(1, micro_batches);
      if (vertical_sync && stage > 0) return 2 + (std::max(0, stages - 1) + m - 1) / m;
      const int behind = std::max(0, stages - stage - 1);  // the stage's warm-up forwards
      return 1 + (behind + m - 1) / m;
    }
    case schedule::WeightPolicy::kFlush: return 1;
  }
  return 1;
}

int64_t WeightBytes(int versions, int64_t parameter_bytes, int64_t optimizer_bytes) {
  return versions * parameter_bytes + optimizer_bytes;
}

absl::StatusOr<Prediction> Predict(const ModelProfile& profile, const ClusterProfile& cluster,
                                   const Layout& layout) {
  const std::vector<LayerProfile> layers =
      profile.sizes.empty() ? std::vector<LayerProfile>{}
                            : LayersAt(profile, layout.pipeline.micro_batch_size);
  if (absl::Status s = CheckLayout(profile, cluster, layout, static_cast<int>(layers.size()));
      !s.ok()) {
    return s;
  }
  const int p = layout.stages(), w = layout.pipeline.replicas, m = layout.pipeline.micro_batches;
  schedule::ScheduleParams params{layout.schedule, p, m, kSimulatedSteps};
  params.virtual_stages = layout.virtual_stages;
  const schedule::ChunkLayout chunks = schedule::LayoutOf(params);
  absl::StatusOr<std::vector<std::vector<Action>>> lists = schedule::BuildSchedule(params);
  if (!lists.ok()) return lists.status();

  std::vector<StageCosts> costs(chunks.stages());
  for (int k = 0; k < chunks.stages(); ++k) {
    costs[k] = CostsOf(profile, cluster, layout, layers, chunks, k);
  }
  std::vector<Averaging> averaging(p);
  std::vector<std::vector<int>> stages_of(p);  // the model stages of each rank
  // Per rank, the positions of its list's last gradient of each model stage before each
  // STEP: where a bucketed AllReduce starts with that backward, or a chunk's after it.
  std::vector<std::vector<bool>> last_gradient(p);
  for (int r = 0; r < p; ++r) {
    averaging[r] = AveragingOf(layout, r);
    stages_of[r] = chunks.StagesOf(r);
    last_gradient[r] = LastGradientOfEachStep((*lists)[r], r);
  }

  // The event loop. A rank is idle (about to start lists[r][next[r]]), computing (work left
  // at full speed), or waiting until a known time (its AllReduce).
  enum class State { kIdle, kComputing, kWaiting, kDone };
  std::vector<State> state(p, State::kIdle);
  std::vector<size_t> next(p, 0);
  std::vector<double> work_left(p, 0), wait_until(p, 0), last_backward_start(p, 0);
  std::vector<double> exposed(p, 0);
  std::vector<double> gradient_end(chunks.stages(), 0);  // a model stage's latest B or W
  std::vector<double> step_end;                          // rank 0's STEP ends
  // CPU work of the transports' own threads (per replica) still to run: it takes its share
  // of the cores like a computing rank.
  std::vector<double> background;
  // A rank's gradient AllReduces: the CPU they still need (per rank; it shares the cores
  // like a computing rank too). A waiting rank goes on once that is done and wait_until
  // has passed.
  std::vector<double> allreduce_cpu_left(p, 0);
  // (kind of the receive, micro-batch, receiving model stage) -> arrival time.
  std::map<std::tuple<ActionKind, int64_t, int>, double> arrivals;
  double now = 0;

  const auto finish_action = [&](int r) {
    const Action& a = (*lists)[r][next[r]];
    const int k = StageOf(a, r);
    if (a.kind == ActionKind::kOptimizerStep && r == 0) {
      step_end.push_back(now);
    } else if (a.kind == ActionKind::kSendActivation) {
      arrivals[{ActionKind::kRecvActivation, a.index, k + 1}] = now + costs[k].send_act_s;
      if (costs[k].act_out.background_s > 0) background.push_back(costs[k].act_out.background_s);
    } else if (a.kind == ActionKind::kSendGradient) {
      arrivals[{ActionKind::kRecvGradient, a.index, k - 1}] = now + costs[k].send_grad_s;
      if (costs[k].grad_out.background_s > 0) background.push_back(costs[k].grad_out.background_s);
    } else if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kWeightGradient) {
      gradient_end[k] = now;
      if (averaging[r] == Averaging::kAfterLastGradient && last_gradient[r][next[r]]) {
        allreduce_cpu_left[r] += costs[k].allreduce_cpu_s;  // its AllReduce starts
      }
    }
    ++next[r];
    state[r] = next[r] == (*lists)[r].size() ? State::kDone : State::kIdle;
  };

  // Rank r's current action costs it `work` seconds of computing (none: it ends now).
  const auto compute_then_finish = [&](int r, double work) {
    if (work > 0) {
      state[r] = State::kComputing;
      work_left[r] = work;
    } else {
      finish_action(r);
    }
  };

  for (;;) {
    // Start everything that can start now, until nothing more can (a send that completes
    // may let a rank visited earlier in the pass go on).
    bool moved = true;
    while (moved) {
      moved = false;
      for (int r = 0; r < p; ++r) {
        if (state[r] == State::kWaiting && wait_until[r] <= now && allreduce_cpu_left[r] <= 0) {
          state[r] = State::kComputing;  // the AllReduces are done: the optimizer runs
          work_left[r] = 0;
          for (int k : stages_of[r]) work_left[r] += costs[k].optimizer_s;
          moved = true;
        }
        if (state[r] != State::kIdle) continue;
        const Action& a = (*lists)[r][next[r]];
        const StageCosts& c = costs[StageOf(a, r)];
        switch (a.kind) {
          case ActionKind::kForward:
            state[r] = State::kComputing;
            work_left[r] = c.forward_s;
            break;
          case ActionKind::kBackward:
            state[r] = State::kComputing;
            work_left[r] = c.backward_s;
            last_backward_start[r] = now;
            if (averaging[r] == Averaging::kDuringLastBackward && last_gradient[r][next[r]]) {
              allreduce_cpu_left[r] = c.allreduce_cpu_s;  // buckets go as they fill
            }
            break;
          case ActionKind::kInputGradient: compute_then_finish(r, c.input_gradient_s); break;
          case ActionKind::kWeightGradient: compute_then_finish(r, c.weight_gradient_s); break;
          case ActionKind::kSendActivation:
          case ActionKind::kSendGradient:
            // The sending thread's part; the message leaves when it is done.
            compute_then_finish(
                r, a.kind == ActionKind::kSendActivation ? c.act_out.send_s : c.grad_out.send_s);
            break;
          case ActionKind::kRecvActivation:
          case ActionKind::kRecvGradient: {
            auto it = arrivals.find({a.kind, a.index, StageOf(a, r)});
            if (it == arrivals.end() || it->second > now) continue;  // not there yet
            arrivals.erase(it);
            // The receiving thread's part.
            compute_then_finish(
                r, a.kind == ActionKind::kRecvActivation ? c.act_in.recv_s : c.grad_in.recv_s);
            break;
          }
          case ActionKind::kOptimizerStep: {
            double done = now;
            switch (averaging[r]) {
              case Averaging::kNone: break;
              case Averaging::kDuringLastBackward:
                done = std::max(last_backward_start[r] + c.allreduce_s,
                                now + c.last_bucket_allreduce_s);
                break;
              case Averaging::kAtUpdate:
                done = now + c.allreduce_s;
                allreduce_cpu_left[r] = c.allreduce_cpu_s;
                break;
              case Averaging::kAfterLastGradient: {
                // Each model stage's started at its last B or W; one after the other.
                std::vector<std::pair<double, int>> order;
                for (int k : stages_of[r]) order.emplace_back(gradient_end[k], k);
                std::sort(order.begin(), order.end());
                double free_at = 0;
                for (const auto& [end, k] : order) {
                  free_at = std::max(free_at, end) + costs[k].allreduce_s;
                }
                done = std::max(now, free_at);
                break;
              }
            }
            if (a.index == kSimulatedSteps - 2) exposed[r] = done - now;
            state[r] = State::kWaiting;
            wait_until[r] = done;
            break;
          }
        }
        moved = true;
      }
    }
    if (std::all_of(state.begin(), state.end(), [](State st) { return st == State::kDone; })) {
      break;
    }
    // The next event: a computation ends, a wait ends, a message arrives.
    int computing = static_cast<int>(background.size());
    for (int r = 0; r < p; ++r) {
      computing += (state[r] == State::kComputing) + (allreduce_cpu_left[r] > 0);
    }
    // Ranks and the transports' threads beyond the cores share them.
    const double rate = SharedCoreRate(profile, cluster, computing, w);
    // Without shared cores the transports' threads are taken to have cores of their own.
    const double background_rate = cluster.shared_cores > 0 ? rate : 1.0;
    double event = kNever;
    for (const double left : background) event = std::min(event, now + left / background_rate);
    for (const double left : allreduce_cpu_left) {
      if (left > 0) event = std::min(event, now + left / background_rate);
    }
    for (int r = 0; r < p; ++r) {
      if (state[r] == State::kComputing) event = std::min(event, now + work_left[r] / rate);
      if (state[r] == State::kWaiting && wait_until[r] > now) {
        event = std::min(event, wait_until[r]);
      }
      if (state[r] == State::kIdle) {
        const Action& a = (*lists)[r][next[r]];
        auto it = arrivals.find({a.kind, a.index, StageOf(a, r)});
        if (it != arrivals.end()) event = std::min(event, it->second);
      }
    }
    if (event == kNever) {
      return absl::InternalError("the simulated schedule cannot go on (no rank can move)");
    }
    const double dt = event - now;
    now = event;
    const double done = 1e-12 * std::max(1.0, now);
    for (double& left : background) left -= dt * background_rate;
    for (double& left : allreduce_cpu_left) {
      if (left > 0 && (left -= dt * background_rate) <= done) left = 0;
    }
    background.erase(std::remove_if(background.begin(), background.end(),
                                    [done](double left) { return left <= done; }),
                     background.end());
    for (int r = 0; r < p; ++r) {
      if (state[r] != State::kComputing) continue;
      work_left[r] -= dt * rate;
      if (work_left[r] <= done) finish_action(r);
    }
  }

  Prediction prediction;
  PT_RETURN_IF_ERROR(SetStepTime(profile, layout, step_end, prediction));
  prediction.stages.resize(p);
  const bool stashing = schedule::WeightsOf(layout.schedule) == schedule::WeightPolicy::kStashed;
  for (int r = 0; r < p; ++r) {
    StagePrediction& out = prediction.stages[r];
    const int versions = WeightVersions(layout.schedule, p, r, m, layout.vertical_sync);
    // Under pipedream a step's micro-batches run on two versions, each with a gradient, when
    // the stage's warm-up (p − s − 1 forwards; vertical sync: stage 0's, p − 1) is not a
    // whole number of steps: the older one's is counted here.
    const int warmup = layout.vertical_sync ? p - 1 : p - r - 1;
    int streams = 0;
    for (int k : stages_of[r]) {
      const StageCosts& c = costs[k];
      out.compute_s += m * (c.forward_s + c.backward_s) + c.optimizer_s;
      out.allreduce_s += c.allreduce_s;
      out.weight_bytes += WeightBytes(versions, c.parameter_bytes, c.optimizer_bytes);
      if (stashing && warmup % m != 0) out.weight_bytes += c.parameter_bytes;
      // What the stage receives from other ranks: activations and the step commands from
      // the previous model stage, gradients from the next, each with receives posted ahead.
      if (k > 0 && chunks.RankOf(k - 1) != r) streams += 2;
      if (k + 1 < chunks.stages() && chunks.RankOf(k + 1) != r) streams += 1;
    }
    const auto [held, in_flight_at_most] =
        HeldAtPeak((*lists)[r], r, last_gradient[r], costs, averaging[r]);
    out.peak_in_flight = in_flight_at_most;
    out.exposed_allreduce_s = exposed[r];
    out.activation_bytes = held;
    out.peak_memory_bytes = out.weight_bytes + out.activation_bytes + profile.base_bytes +
                            streams * profile.receive_buffer_bytes;
    prediction.peak_memory_bytes = std::max(prediction.peak_memory_bytes, out.peak_memory_bytes);
  }
  return prediction;
}

}  // namespace pipetrain::planner
