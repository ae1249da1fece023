// Predict for the schedules whose ranks hold several model stages (interleaved, zb1p, zbv,
// dualpipev): every rank's real list (runtime/schedule) through a discrete-event simulation
// with the profiled costs of each model stage. See predict.h for what it models.
#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/planner/host_placement.h"
#include "runtime/planner/predict_internal.h"
#include "runtime/schedule/chunked_schedule.h"

namespace pipetrain::planner::internal {
namespace {

using schedule::Action;
using schedule::ActionKind;

constexpr double kNever = std::numeric_limits<double>::infinity();

// One model stage's costs.
struct ChunkCosts {
  double forward_s = 0, backward_s = 0, input_gradient_s = 0, weight_gradient_s = 0;
  double optimizer_s = 0, allreduce_s = 0;
  double send_act_s = 0, send_grad_s = 0;  // the link, to the next / previous model stage
  MessageCost act_out, grad_out;
  int64_t parameter_bytes = 0, optimizer_bytes = 0;
  MicroBatchBytes micro_batch;
};

ChunkCosts CostsOf(const ModelProfile& profile, const ClusterProfile& cluster, const Layout& layout,
                   const std::vector<LayerProfile>& layers, int k, int rank) {
  const auto [begin, end] = layout.pipeline.stage_layers[k];
  ChunkCosts c;
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
  c.allreduce_s = AllReduceSeconds(cluster, static_cast<double>(c.parameter_bytes),
                                   layout.pipeline.replicas, 1, ReplicasSpanHosts(layout, rank));
  const auto way = [&](const MessageCost& cost, double bytes) {
    return cost.latency_s > 0 ? cost.latency_s : cluster.link.Seconds(bytes);
  };
  if (end < static_cast<int>(layers.size())) {
    const double bytes = static_cast<double>(layers[end - 1].output_bytes);
    c.act_out = MessageCostAt(profile.message_costs, bytes);
    c.send_act_s = way(c.act_out, bytes);
  }
  if (begin > 0) {
    const double bytes = static_cast<double>(layers[begin - 1].output_bytes);
    c.grad_out = MessageCostAt(profile.message_costs, bytes);
    c.send_grad_s = way(c.grad_out, bytes);
  }
  c.micro_batch = MicroBatchMemory(profile, layers, layout, begin, end);
  return c;
}

// The most rank `list` holds at once: its model stages' micro-batches in flight (each keeps
// what its forward stashed until its B, or until its W where the backward is split: counted
// whole, an upper bound, with what I recomputed added from I to W), every stage's gradient (from the step's start: an upper bound),
// what the running backward adds, and at STEP the AllReduce's flat copy (w > 1). Also the
// most micro-batches in flight.
std::pair<int64_t, int> RankHeldAtPeak(const std::vector<Action>& list,
                                       const std::map<int, ChunkCosts>& chunks, bool averaged) {
  int64_t held = 0, gradients = 0, peak = 0;
  int in_flight = 0, peak_in_flight = 0;
  for (const auto& [k, c] : chunks) gradients += c.parameter_bytes;
  for (const Action& a : list) {
    if (!schedule::IsCompute(a.kind) && a.kind != ActionKind::kOptimizerStep) continue;
    if (a.kind == ActionKind::kOptimizerStep) {
      peak = std::max(peak, held + gradients * (averaged ? 2 : 1));
      continue;
    }
    const ChunkCosts& c = chunks.at(a.stage);
    switch (a.kind) {
      case ActionKind::kForward:
        held += c.micro_batch.kept;
        peak_in_flight = std::max(peak_in_flight, ++in_flight);
        peak = std::max(peak, held + gradients);
        break;
      case ActionKind::kBackward:
      case ActionKind::kInputGradient:
      case ActionKind::kWeightGradient: {
        // The backward's own peak: what the micro-batch keeps, its working memory and the
        // stage's gradient, beside everything else.
        peak = std::max(peak, held - c.micro_batch.kept + c.micro_batch.backward_later + gradients -
                                  c.parameter_bytes);
        if (a.kind == ActionKind::kInputGradient) {
          held += c.micro_batch.recomputed;  // until W
          peak = std::max(peak, held + gradients);
        } else {
          held -= c.micro_batch.kept;
          if (a.kind == ActionKind::kWeightGradient) held -= c.micro_batch.recomputed;
          --in_flight;
        }
        break;
      }
      default:
        break;
    }
  }
  return {peak, peak_in_flight};
}

}  // namespace

absl::StatusOr<Prediction> PredictChunked(const ModelProfile& profile,
                                          const ClusterProfile& cluster, const Layout& layout,
                                          const std::vector<LayerProfile>& layers) {
  const int p = layout.stages(), w = layout.pipeline.replicas;
  schedule::ScheduleParams params{layout.schedule, p, layout.pipeline.micro_batches,
                                  kSimulatedSteps};
  params.virtual_stages = layout.virtual_stages;
  const schedule::ChunkLayout chunks = schedule::LayoutOf(params);
  const int model_stages = chunks.stages();
  absl::StatusOr<std::vector<std::vector<Action>>> lists = schedule::BuildSchedule(params);
  if (!lists.ok()) return lists.status();

  std::vector<ChunkCosts> costs(model_stages);
  std::vector<std::map<int, ChunkCosts>> held_by(p);
  for (int k = 0; k < model_stages; ++k) {
    const int r = chunks.RankOf(k);
    costs[k] = CostsOf(profile, cluster, layout, layers, k, r);
    held_by[r][k] = costs[k];
  }

  enum class State { kIdle, kComputing, kWaiting, kDone };
  std::vector<State> state(p, State::kIdle);
  std::vector<size_t> next(p, 0);
  std::vector<double> work_left(p, 0), wait_until(p, 0), exposed(p, 0);
  std::vector<double> gradient_end(model_stages, 0);  // the stage's last B or W of the step
  std::vector<double> step_end;                       // rank 0's STEP ends
  // (kind of the receive, micro-batch, receiving model stage) -> arrival time.
  std::map<std::tuple<ActionKind, int64_t, int>, double> arrivals;
  double now = 0;

  const auto finish_action = [&](int r) {
    const Action& a = (*lists)[r][next[r]];
    const int k = a.stage;
    switch (a.kind) {
      case ActionKind::kOptimizerStep:
        if (r == 0) step_end.push_back(now);
        break;
      case ActionKind::kForward:
        if (k + 1 < model_stages && chunks.RankOf(k + 1) == r) {
          arrivals[{ActionKind::kRecvActivation, a.index, k + 1}] = now;  // handed over
        }
        break;
      case ActionKind::kBackward:
      case ActionKind::kInputGradient:
        if (k > 0 && chunks.RankOf(k - 1) == r) {
          arrivals[{ActionKind::kRecvGradient, a.index, k - 1}] = now;
        }
        if (a.kind == ActionKind::kBackward) gradient_end[k] = now;
        break;
      case ActionKind::kWeightGradient:
        gradient_end[k] = now;
        break;
      case ActionKind::kSendActivation:
        arrivals[{ActionKind::kRecvActivation, a.index, k + 1}] = now + costs[k].send_act_s;
        break;
      case ActionKind::kSendGradient:
        arrivals[{ActionKind::kRecvGradient, a.index, k - 1}] = now + costs[k].send_grad_s;
        break;
      default:
        break;
    }
    ++next[r];
    state[r] = next[r] == (*lists)[r].size() ? State::kDone : State::kIdle;
  };
  // What a compute action waits for (its receive, which the lowering places right before
  // it): kNever while not yet sent.
  const auto ready_at = [&](const Action& a) {
    std::tuple<ActionKind, int64_t, int> key;
    if (a.kind == ActionKind::kForward && a.stage > 0) {
      key = {ActionKind::kRecvActivation, a.index, a.stage};
    } else if (schedule::IsBackward(a.kind) && a.stage + 1 < model_stages) {
      key = {ActionKind::kRecvGradient, a.index, a.stage};
    } else {
      return 0.0;
    }
    auto it = arrivals.find(key);
    return it == arrivals.end() ? kNever : it->second;
  };

  for (;;) {
    // Start everything that can start now, until nothing more can (a send that completes
    // may let a rank visited earlier in the pass go on).
    for (bool moved = true; moved;) {
      moved = false;
      const std::vector<size_t> before = next;
      const std::vector<State> states_before = state;
      for (int r = 0; r < p; ++r) {
        if (state[r] == State::kWaiting && wait_until[r] <= now) {
          state[r] = State::kComputing;  // the AllReduces are done: the optimizer runs
          work_left[r] = 0;
          for (const auto& [k, c] : held_by[r]) work_left[r] += c.optimizer_s;
        }
        while (state[r] == State::kIdle) {
          const Action& a = (*lists)[r][next[r]];
          double work = 0;
          switch (a.kind) {
            case ActionKind::kForward:
            case ActionKind::kBackward:
            case ActionKind::kInputGradient:
            case ActionKind::kWeightGradient: {
              if (ready_at(a) > now) break;
              const ChunkCosts& c = costs[a.stage];
              work = a.kind == ActionKind::kForward         ? c.forward_s
                     : a.kind == ActionKind::kBackward      ? c.backward_s
                     : a.kind == ActionKind::kInputGradient ? c.input_gradient_s
                                                            : c.weight_gradient_s;
              // Taking in what another rank sent: the receiving thread's part.
              if (a.kind == ActionKind::kForward && a.stage > 0 &&
                  chunks.RankOf(a.stage - 1) != r) {
                work += costs[a.stage - 1].act_out.recv_s;
              } else if (schedule::IsBackward(a.kind) && a.stage + 1 < model_stages &&
                         chunks.RankOf(a.stage + 1) != r) {
                work += costs[a.stage + 1].grad_out.recv_s;
              }
              break;
            }
            case ActionKind::kSendActivation:
              work = costs[a.stage].act_out.send_s;
              break;
            case ActionKind::kSendGradient:
              work = costs[a.stage].grad_out.send_s;
              break;
            case ActionKind::kOptimizerStep: {
              // Each stage's AllReduce started at its last B or W; one after the other.
              double done = now;
              if (w > 1) {
                std::vector<std::pair<double, int>> order;
                for (const auto& [k, c] : held_by[r]) order.emplace_back(gradient_end[k], k);
                std::sort(order.begin(), order.end());
                double free_at = 0;
                for (const auto& [end, k] : order) {
                  free_at = std::max(free_at, end) + costs[k].allreduce_s;
                }
                done = std::max(now, free_at);
              }
              if (a.index == kSimulatedSteps - 2) exposed[r] = done - now;
              state[r] = State::kWaiting;
              wait_until[r] = done;
              continue;
            }
            default:
              break;  // a receive: posted, no time of its own
          }
          if (schedule::IsCompute(a.kind) && ready_at(a) > now) break;  // waits
          if (work > 0) {
            state[r] = State::kComputing;
            work_left[r] = work;
          } else {
            finish_action(r);
          }
        }
        if (state[r] == State::kWaiting && wait_until[r] <= now) --r;  // start its optimizer
      }
      moved = next != before || state != states_before;
    }
    if (std::all_of(state.begin(), state.end(), [](State s) { return s == State::kDone; })) {
      break;
    }
    int computing = 0;
    for (int r = 0; r < p; ++r) computing += state[r] == State::kComputing;
    const double rate = SharedCoreRate(profile, cluster, computing, w);
    double event = kNever;
    for (int r = 0; r < p; ++r) {
      if (state[r] == State::kComputing) event = std::min(event, now + work_left[r] / rate);
      if (state[r] == State::kWaiting) event = std::min(event, wait_until[r]);
      if (state[r] == State::kIdle) {
        const double at = ready_at((*lists)[r][next[r]]);
        if (at > now) event = std::min(event, at);
      }
    }
    if (event == kNever) {
      return absl::InternalError("the simulated schedule cannot go on (no rank can move)");
    }
    const double dt = event - now;
    now = event;
    const double done = 1e-12 * std::max(1.0, now);
    for (int r = 0; r < p; ++r) {
      if (state[r] != State::kComputing) continue;
      work_left[r] -= dt * rate;
      if (work_left[r] <= done) finish_action(r);
    }
  }

  Prediction prediction;
  PT_RETURN_IF_ERROR(SetStepTime(profile, layout, step_end, prediction));
  prediction.stages.resize(p);
  const int m = layout.pipeline.micro_batches;
  for (int r = 0; r < p; ++r) {
    StagePrediction& out = prediction.stages[r];
    int streams = 0;
    for (const auto& [k, c] : held_by[r]) {
      out.compute_s += m * (c.forward_s + c.backward_s) + c.optimizer_s;
      out.allreduce_s += w > 1 ? c.allreduce_s : 0;
      out.weight_bytes += WeightBytes(1, c.parameter_bytes, c.optimizer_bytes);
      // Activations and step commands from the previous model stage, gradients from the
      // next, where those are on other ranks.
      if (k > 0 && chunks.RankOf(k - 1) != r) streams += 2;
      if (k + 1 < model_stages && chunks.RankOf(k + 1) != r) streams += 1;
    }
    out.exposed_allreduce_s = exposed[r];
    const auto [held, in_flight] = RankHeldAtPeak((*lists)[r], held_by[r], w > 1);
    out.activation_bytes = held;
    out.peak_in_flight = in_flight;
    out.peak_memory_bytes = out.weight_bytes + out.activation_bytes + profile.base_bytes +
                            streams * profile.receive_buffer_bytes;
    prediction.peak_memory_bytes = std::max(prediction.peak_memory_bytes, out.peak_memory_bytes);
  }
  return prediction;
}

}  // namespace pipetrain::planner::internal
