#include "runtime/planner/predict.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/planner/host_placement.h"
#include "runtime/planner/predict_internal.h"

namespace pipetrain::planner {
namespace {

using schedule::Action;
using schedule::ActionKind;
using internal::MicroBatchBytes;
using internal::MicroBatchMemory;
using internal::ReceivedBytes;

constexpr double kNever = std::numeric_limits<double>::infinity();
using internal::kSimulatedSteps;

struct StageCosts {
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  // The gradient AllReduce of a step (w > 1): elapsed, its last bucket's alone, and the CPU
  // it takes from each rank (every bucket's fixed cost and the bytes).
  double allreduce_s = 0, last_bucket_allreduce_s = 0, allreduce_cpu_s = 0;
  double send_act_s = 0, send_grad_s = 0;  // link time of the stage's output / input gradient
  // CPU of the messages the stage sends (its output, its input's gradient) and receives.
  MessageCost act_out, grad_out, act_in, grad_in;
  int64_t gradient_bytes = 0;  // one copy of the stage's parameters' gradients
};

// For each action of a stage's list, whether it is the last backward before a STEP.
std::vector<bool> LastBackwardOfEachStep(const std::vector<Action>& list) {
  std::vector<bool> last_of_step(list.size(), false);
  for (size_t i = 0, last = list.size(); i < list.size(); ++i) {
    if (list[i].kind == ActionKind::kBackward) last = i;
    if (list[i].kind == ActionKind::kOptimizerStep && last < list.size()) {
      last_of_step[last] = true;
      last = list.size();
    }
  }
  return last_of_step;
}

// How a stage averages its gradient among replicas: not at all (w = 1), at its update, or
// during the step's last backward (stage 0 with the AllReduce overlapped). Either way the
// AllReduce works on a flat copy of the gradient.
enum class Averaging { kNone, kAtUpdate, kDuringLastBackward };

// The most a stage holds at once of its micro-batches in flight, its gradient and the
// AllReduce's copy of it, walking its action list: each micro-batch keeps `m.kept` from its F
// to its B and holds at most `m.backward_*` during its B (the gradient included); the
// gradient exists from the step's first backward to its update (STEP drops it), and its
// flat copy while it is averaged. Also the most micro-batches in flight.
// `last_of_step`: LastBackwardOfEachStep(list).
std::pair<int64_t, int> HeldAtPeak(const std::vector<Action>& list,
                                   const std::vector<bool>& last_of_step,
                                   const MicroBatchBytes& m, int64_t gradient_bytes,
                                   Averaging averaging) {
  int in_flight = 0, peak_in_flight = 0;
  bool gradient = false;
  int64_t peak = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (a.kind == ActionKind::kForward) {
      peak_in_flight = std::max(peak_in_flight, ++in_flight);
      peak = std::max(peak, in_flight * m.kept + (gradient ? gradient_bytes : 0));
    } else if (a.kind == ActionKind::kBackward) {
      const int64_t others = (in_flight - 1) * m.kept;
      if (averaging == Averaging::kDuringLastBackward && last_of_step[i]) {
        peak = std::max(peak, others + (gradient ? m.overlapped_later : m.overlapped_first));
        // Its end: the micro-batch gone, the gradient and its copy before the average.
        peak = std::max(peak, others + 2 * gradient_bytes);
      } else {
        peak = std::max(peak, others + (gradient ? m.backward_later : m.backward_first));
      }
      --in_flight;
      gradient = true;
    } else if (a.kind == ActionKind::kOptimizerStep) {
      if (averaging == Averaging::kAtUpdate && gradient) {
        peak = std::max(peak, in_flight * m.kept + 2 * gradient_bytes);
      }
      gradient = false;
    }
  }
  return {peak, peak_in_flight};
}

absl::Status CheckLayout(const ModelProfile& profile, const ClusterProfile& cluster,
                         const Layout& layout, int layers) {
  if (profile.sizes.empty()) return absl::InvalidArgumentError("the profile has no measurements");
  if (layout.stages() < 1) return absl::InvalidArgumentError("a layout needs at least one stage");
  if (layout.virtual_stages < 1 ||
      layout.stages() * layout.virtual_stages !=
          static_cast<int>(layout.pipeline.stage_layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a layout of ", layout.stages(), " stages",
        layout.virtual_stages == 1 ? ""
                                   : absl::StrCat(" (", layout.virtual_stages, " a rank)"),
        " has ", layout.pipeline.stage_layers.size(),
        " layer ranges (SetStageLayers, SetModelStageLayers)"));
  }
  int next = 0;
  for (const auto& [begin, end] : layout.pipeline.stage_layers) {
    if (begin != next || end <= begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ranges must be contiguous and non-empty from layer 0: got [",
                       begin, ", ", end, ") after layer ", next));
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
  schedule::ScheduleParams params{layout.schedule, layout.stages(),
                                  layout.pipeline.micro_batches, kSimulatedSteps};
  params.virtual_stages = layout.virtual_stages;
  return schedule::ValidateScheduleParams(params);
}

}  // namespace

int WeightVersions(schedule::ScheduleKind schedule, int stages, int stage, int micro_batches,
                   bool vertical_sync) {
  switch (schedule::WeightsOf(schedule)) {
    case schedule::WeightPolicy::kDoubleBuffered:
      return 2;
    case schedule::WeightPolicy::kStashed: {
      const int m = std::max(1, micro_batches);
      if (vertical_sync && stage > 0) return 2 + (std::max(0, stages - 1) + m - 1) / m;
      const int behind = std::max(0, stages - stage - 1);  // the stage's warm-up forwards
      return 1 + (behind + m - 1) / m;
    }
    case schedule::WeightPolicy::kFlush:
      return 1;
  }
  return 1;
}

int64_t WeightBytes(int versions, int64_t parameter_bytes, int64_t optimizer_bytes) {
  return versions * parameter_bytes + optimizer_bytes;
}

absl::StatusOr<Prediction> Predict(const ModelProfile& profile, const ClusterProfile& cluster,
                                   const Layout& layout) {
  const bool stashing = schedule::WeightsOf(layout.schedule) == schedule::WeightPolicy::kStashed;
  const std::vector<LayerProfile> layers =
      profile.sizes.empty() ? std::vector<LayerProfile>{}
                            : LayersAt(profile, layout.pipeline.micro_batch_size);
  if (absl::Status s = CheckLayout(profile, cluster, layout, static_cast<int>(layers.size()));
      !s.ok()) {
    return s;
  }
  if (schedule::HoldsChunks(layout.schedule)) {
    return internal::PredictChunked(profile, cluster, layout, layers);
  }
  const int p = layout.stages(), w = layout.pipeline.replicas;
  const LinkProfile& link = cluster.link;

  std::vector<StageCosts> costs(p);
  Prediction prediction;
  prediction.stages.resize(p);
  for (int s = 0; s < p; ++s) {
    const auto [begin, end] = layout.pipeline.stage_layers[s];
    StageCosts& c = costs[s];
    double parameter_bytes = 0, optimizer_bytes = 0;
    for (int l = begin; l < end; ++l) {
      c.forward_s += layers[l].forward_s;
      c.backward_s += layers[l].backward_s + (layout.recomputes(l) ? layers[l].forward_s : 0);
      c.optimizer_s += layers[l].optimizer_s;
      parameter_bytes += static_cast<double>(layers[l].parameter_bytes);
      optimizer_bytes += static_cast<double>(layers[l].optimizer_bytes);
    }
    // Stage 0 with overlap averages bucket by bucket, each bucket a collective of its own;
    // the other stages (and pipedream's, whose gradient is summed over versions at STEP)
    // average the whole gradient at once.
    const bool bucketed = s == 0 && layout.overlap_allreduce && !stashing;
    const int calls =
        bucketed ? std::max(1, static_cast<int>(std::ceil(
                                   parameter_bytes / std::max<int64_t>(1, layout.bucket_bytes))))
                 : 1;
    const bool ring_spans_hosts = ReplicasSpanHosts(layout, s);
    c.allreduce_s = AllReduceSeconds(cluster, parameter_bytes, w, calls, ring_spans_hosts);
    c.last_bucket_allreduce_s = AllReduceSeconds(
        cluster, std::min<double>(parameter_bytes, static_cast<double>(layout.bucket_bytes)), w,
        1, ring_spans_hosts);
    c.allreduce_cpu_s = AllReduceCpuSeconds(profile, parameter_bytes, w, calls);
    // A message's way: between hosts on their link, its bandwidth shared by the replicas
    // whose same message crosses it at the same instant; within one as measured between
    // busy ranks, else the link's latency + bandwidth.
    const bool between_measured = cluster.between_hosts.bytes_per_s > 0;
    const auto way = [&](const MessageCost& cost, double bytes, int boundary) {
      const int sharing = ReplicasSharingBoundaryLink(layout, boundary);
      if (sharing > 0 && between_measured) {
        const LinkProfile& between = cluster.between_hosts;
        return between.latency_s + sharing * bytes / between.bytes_per_s;
      }
      return cost.latency_s > 0 ? cost.latency_s : link.Seconds(bytes);
    };
    if (end < static_cast<int>(layers.size())) {
      const double bytes = static_cast<double>(layers[end - 1].output_bytes);
      c.act_out = c.grad_in = MessageCostAt(profile.message_costs, bytes);
      c.send_act_s = way(c.act_out, bytes, s);
    }
    if (begin > 0) {
      const double bytes = static_cast<double>(layers[begin - 1].output_bytes);
      c.grad_out = c.act_in = MessageCostAt(profile.message_costs, bytes);
      c.send_grad_s = way(c.grad_out, bytes, s - 1);
    }
    StagePrediction& out = prediction.stages[s];
    const int versions = WeightVersions(layout.schedule, p, s, layout.pipeline.micro_batches,
                                        layout.vertical_sync);
    out.weight_bytes = WeightBytes(versions, static_cast<int64_t>(parameter_bytes),
                                   static_cast<int64_t>(optimizer_bytes));
    // Under pipedream a step's micro-batches run on two versions, each with a gradient, when
    // the stage's warm-up (p − s − 1 forwards; vertical sync: stage 0's, p − 1) is not a
    // whole number of steps: the older one's is counted here.
    const int warmup = layout.vertical_sync ? p - 1 : p - s - 1;
    if (stashing && warmup % layout.pipeline.micro_batches != 0) {
      out.weight_bytes += static_cast<int64_t>(parameter_bytes);
    }
    costs[s].gradient_bytes = static_cast<int64_t>(parameter_bytes);
    out.allreduce_s = c.allreduce_s;
    out.compute_s = layout.pipeline.micro_batches * (c.forward_s + c.backward_s) + c.optimizer_s;
  }

  schedule::ScheduleParams params{layout.schedule, p, layout.pipeline.micro_batches,
                                  kSimulatedSteps};
  absl::StatusOr<std::vector<std::vector<Action>>> lists = schedule::BuildSchedule(params);
  if (!lists.ok()) return lists.status();

  // The event loop. A stage is idle (about to start lists[s][next[s]]), computing (work left
  // at full speed), or waiting until a known time (its AllReduce).
  enum class State { kIdle, kComputing, kWaiting, kDone };
  std::vector<State> state(p, State::kIdle);
  std::vector<size_t> next(p, 0);
  std::vector<double> work_left(p, 0), wait_until(p, 0), last_backward_start(p, 0);
  std::vector<double> exposed(p, 0);
  std::vector<double> step_end;  // stage 0's STEP ends
  // CPU work of the transports' own threads (per replica) still to run: it takes its share
  // of the cores like a computing rank.
  std::vector<double> background;
  // A stage's gradient AllReduce: the CPU it still needs (per rank; it shares the cores
  // like a computing rank too). A waiting stage goes on once that is done and wait_until
  // has passed.
  std::vector<double> allreduce_cpu_left(p, 0);
  // Per stage, the positions of its lists' last backward before each STEP: where stage 0
  // with overlap starts its bucketed AllReduce.
  std::vector<std::vector<bool>> last_backward(p);
  for (int s = 0; s < p; ++s) last_backward[s] = LastBackwardOfEachStep((*lists)[s]);
  const bool overlapped = w > 1 && layout.overlap_allreduce && !stashing;
  // (kind, micro-batch, receiving stage) -> arrival time.
  std::map<std::tuple<ActionKind, int64_t, int>, double> arrivals;
  double now = 0;

  const auto finish_action = [&](int s) {
    const Action& a = (*lists)[s][next[s]];
    if (a.kind == ActionKind::kOptimizerStep && s == 0) {
      step_end.push_back(now);
    } else if (a.kind == ActionKind::kSendActivation) {
      arrivals[{ActionKind::kRecvActivation, a.index, s + 1}] = now + costs[s].send_act_s;
      if (costs[s].act_out.background_s > 0) background.push_back(costs[s].act_out.background_s);
    } else if (a.kind == ActionKind::kSendGradient) {
      arrivals[{ActionKind::kRecvGradient, a.index, s - 1}] = now + costs[s].send_grad_s;
      if (costs[s].grad_out.background_s > 0) background.push_back(costs[s].grad_out.background_s);
    }
    ++next[s];
    state[s] = next[s] == (*lists)[s].size() ? State::kDone : State::kIdle;
  };

  // Stage s's current action costs it `work` seconds of computing (none: it ends now).
  const auto compute_then_finish = [&](int s, double work) {
    if (work > 0) {
      state[s] = State::kComputing;
      work_left[s] = work;
    } else {
      finish_action(s);
    }
  };

  for (;;) {
    // Start everything that can start now.
    bool moved = true;
    while (moved) {
      moved = false;
      for (int s = 0; s < p; ++s) {
        if (state[s] == State::kWaiting && wait_until[s] <= now && allreduce_cpu_left[s] <= 0) {
          state[s] = State::kComputing;  // the AllReduce is done: the optimizer runs
          work_left[s] = costs[s].optimizer_s;
          moved = true;
        }
        if (state[s] != State::kIdle) continue;
        const Action& a = (*lists)[s][next[s]];
        switch (a.kind) {
          case ActionKind::kForward:
            state[s] = State::kComputing;
            work_left[s] = costs[s].forward_s;
            break;
          case ActionKind::kBackward:
            state[s] = State::kComputing;
            work_left[s] = costs[s].backward_s;
            last_backward_start[s] = now;
            if (s == 0 && overlapped && last_backward[s][next[s]]) {
              allreduce_cpu_left[s] = costs[s].allreduce_cpu_s;  // buckets go as they fill
            }
            break;
          case ActionKind::kSendActivation:
          case ActionKind::kSendGradient:
            // The sending thread's part; the message leaves when it is done.
            compute_then_finish(s, a.kind == ActionKind::kSendActivation
                                       ? costs[s].act_out.send_s
                                       : costs[s].grad_out.send_s);
            break;
          case ActionKind::kRecvActivation:
          case ActionKind::kRecvGradient: {
            auto it = arrivals.find({a.kind, a.index, s});
            if (it == arrivals.end() || it->second > now) continue;  // not there yet
            arrivals.erase(it);
            // The receiving thread's part.
            compute_then_finish(s, a.kind == ActionKind::kRecvActivation
                                       ? costs[s].act_in.recv_s
                                       : costs[s].grad_in.recv_s);
            break;
          }
          case ActionKind::kOptimizerStep: {
            double done = now;
            if (w > 1) {
              if (s == 0 && overlapped) {
                done = std::max(last_backward_start[s] + costs[s].allreduce_s,
                                now + costs[s].last_bucket_allreduce_s);
              } else {
                done = now + costs[s].allreduce_s;
                allreduce_cpu_left[s] = costs[s].allreduce_cpu_s;
              }
            }
            if (a.index == kSimulatedSteps - 2) exposed[s] = done - now;
            state[s] = State::kWaiting;
            wait_until[s] = done;
            break;
          }
          case ActionKind::kInputGradient:
          case ActionKind::kWeightGradient:
            // Lists of one stage a rank (BuildSchedule) have none; chunked kinds go to
            // PredictChunked.
            return absl::InternalError(absl::StrCat(
                "an I or W in a list of ", std::string(schedule::ScheduleKindName(layout.schedule))));
        }
        moved = true;
      }
    }
    if (std::all_of(state.begin(), state.end(), [](State st) { return st == State::kDone; })) {
      break;
    }
    // The next event: a computation ends, a wait ends, a message arrives.
    int computing = static_cast<int>(background.size());
    for (int s = 0; s < p; ++s) {
      computing += (state[s] == State::kComputing) + (allreduce_cpu_left[s] > 0);
    }
    // Ranks and the transports' threads beyond the cores share them.
    const double rate = internal::SharedCoreRate(profile, cluster, computing, w);
    // Without shared cores the transports' threads are taken to have cores of their own.
    const double background_rate = cluster.shared_cores > 0 ? rate : 1.0;
    double event = kNever;
    for (const double left : background) event = std::min(event, now + left / background_rate);
    for (const double left : allreduce_cpu_left) {
      if (left > 0) event = std::min(event, now + left / background_rate);
    }
    for (int s = 0; s < p; ++s) {
      if (state[s] == State::kComputing) event = std::min(event, now + work_left[s] / rate);
      if (state[s] == State::kWaiting && wait_until[s] > now) {
        event = std::min(event, wait_until[s]);
      }
      if (state[s] == State::kIdle) {
        const Action& a = (*lists)[s][next[s]];
        auto it = arrivals.find({a.kind, a.index, s});
        if (it != arrivals.end()) event = std::min(event, it->second);
      }
    }
    if (event == kNever) {
      return absl::InternalError("the simulated schedule cannot go on (no stage can move)");
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
    for (int s = 0; s < p; ++s) {
      if (state[s] != State::kComputing) continue;
      work_left[s] -= dt * rate;
      if (work_left[s] <= done) finish_action(s);
    }
  }

  PT_RETURN_IF_ERROR(internal::SetStepTime(profile, layout, step_end, prediction));
  for (int s = 0; s < p; ++s) {
    StagePrediction& out = prediction.stages[s];
    const auto [begin, end] = layout.pipeline.stage_layers[s];
    const MicroBatchBytes micro_batch = MicroBatchMemory(profile, layers, layout, begin, end);
    Averaging averaging = Averaging::kNone;
    if (w > 1) {
      averaging = s == 0 && overlapped ? Averaging::kDuringLastBackward : Averaging::kAtUpdate;
    }
    const auto [held, in_flight_at_most] =
        HeldAtPeak((*lists)[s], last_backward[s], micro_batch, costs[s].gradient_bytes, averaging);
    out.peak_in_flight = in_flight_at_most;
    out.exposed_allreduce_s = exposed[s];
    out.activation_bytes = held;
    // What a stage receives: activations and the step commands from s - 1, gradients from
    // s + 1, each with receives posted ahead.
    const int streams = (s > 0 ? 2 : 0) + (s + 1 < p ? 1 : 0);
    out.peak_memory_bytes = out.weight_bytes + out.activation_bytes + profile.base_bytes +
                            streams * profile.receive_buffer_bytes;
    prediction.peak_memory_bytes = std::max(prediction.peak_memory_bytes, out.peak_memory_bytes);
  }
  return prediction;
}

}  // namespace pipetrain::planner
