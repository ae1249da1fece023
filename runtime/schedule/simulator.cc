#include "runtime/schedule/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::schedule {
namespace {

// Where each action of one stage's list sits, by kind and micro-batch (or mini-batch).
struct StageIndex {
  std::map<int64_t, size_t> forward, backward;
  std::map<int64_t, size_t> send_act, recv_act, send_grad, recv_grad;
  std::map<int64_t, size_t> step;

  std::map<int64_t, size_t>& Of(ActionKind kind) {
    switch (kind) {
      case ActionKind::kForward: return forward;
      case ActionKind::kBackward: return backward;
      case ActionKind::kSendActivation: return send_act;
      case ActionKind::kRecvActivation: return recv_act;
      case ActionKind::kSendGradient: return send_grad;
      case ActionKind::kRecvGradient: return recv_grad;
      case ActionKind::kOptimizerStep:
      case ActionKind::kInputGradient:  // refused by IsKnownKind
      case ActionKind::kWeightGradient: break;
    }
    return step;
  }
};

bool IsKnownKind(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
    case ActionKind::kBackward:
    case ActionKind::kSendActivation:
    case ActionKind::kRecvActivation:
    case ActionKind::kSendGradient:
    case ActionKind::kRecvGradient:
    case ActionKind::kOptimizerStep: return true;
    case ActionKind::kInputGradient:  // split backward: chunked lists (compute_lists.h)
    case ActionKind::kWeightGradient: return false;
  }
  return false;
}

// Indexes one stage's list and checks what can be checked within the stage.
absl::StatusOr<StageIndex> IndexStage(const std::vector<Action>& actions, int s, int p) {
  StageIndex idx;
  auto error = [s](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": ", parts...));
  };
  for (size_t pos = 0; pos < actions.size(); ++pos) {
    const Action& a = actions[pos];
    if (!IsKnownKind(a.kind) || a.stage != kOwnStage) {
      return error("action ", pos, " (", ToString(a),
                   ") is not one of a list of one stage "
                   "per rank (F, B, SEND_*, RECV_*, STEP without a stage number)");
    }
    const std::string name = ToString(a);
    const int64_t j = a.index;
    if (j < 0) return error(name, " (action ", pos, ") has a negative index");
    auto& seen = idx.Of(a.kind);
    if (auto it = seen.find(j); it != seen.end()) {
      return error("duplicate ", name, " (actions ", it->second, " and ", pos, ")");
    }
    seen.emplace(j, pos);
    switch (a.kind) {
      case ActionKind::kForward:
      case ActionKind::kOptimizerStep:
      case ActionKind::kInputGradient:  // refused above
      case ActionKind::kWeightGradient: break;
      case ActionKind::kBackward:
        if (idx.forward.count(j) == 0) {
          return error(name, " (action ", pos, ") comes before any ", ToString(F(j)));
        }
        break;
      case ActionKind::kSendActivation:
        if (s == p - 1) return error(name, " on the last stage has no next stage");
        if (idx.forward.count(j) == 0) return error(name, " comes before ", ToString(F(j)));
        break;
      case ActionKind::kRecvActivation:
        if (s == 0) return error(name, " on the first stage has no previous stage");
        if (idx.forward.count(j) != 0) return error(name, " comes after ", ToString(F(j)));
        break;
      case ActionKind::kSendGradient:
        if (s == 0) return error(name, " on the first stage has no previous stage");
        if (idx.backward.count(j) == 0) return error(name, " comes before ", ToString(B(j)));
        break;
      case ActionKind::kRecvGradient:
        if (s == p - 1) return error(name, " on the last stage has no next stage");
        if (idx.backward.count(j) != 0) return error(name, " comes after ", ToString(B(j)));
        break;
    }
  }
  for (const auto& [j, pos] : idx.forward) {
    if (idx.backward.count(j) == 0) {
      return error(ToString(F(j)), " (action ", pos, ") has no ", ToString(B(j)));
    }
  }
  return idx;
}

// Every SEND of kind `send_kind` on stage `from` must be matched by exactly one RECV of kind
// `recv_kind` on stage `to`, and vice versa. Duplicates were rejected by IndexStage.
absl::Status CheckMatched(const std::map<int64_t, size_t>& sends, ActionKind send_kind, int from,
                          const std::map<int64_t, size_t>& recvs, ActionKind recv_kind, int to) {
  for (const auto& [j, pos] : sends) {
    if (recvs.count(j) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", from, ": ", ToString({send_kind, j}),
                                                     " has no matching ", ToString({recv_kind, j}),
                                                     " on stage ", to));
    }
  }
  for (const auto& [j, pos] : recvs) {
    if (sends.count(j) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("stage ", to, ": ", ToString({recv_kind, j}),
                                                     " has no matching ", ToString({send_kind, j}),
                                                     " on stage ", from));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StageIndex>> IndexAndCheck(
    const std::vector<std::vector<Action>>& stages) {
  const int p = static_cast<int>(stages.size());
  if (p == 0) return absl::InvalidArgumentError("schedule has no stages");
  std::vector<StageIndex> index;
  index.reserve(p);
  for (int s = 0; s < p; ++s) {
    PT_ASSIGN_OR_RETURN(StageIndex idx, IndexStage(stages[s], s, p));
    index.push_back(std::move(idx));
  }
  // The same micro-batches on every stage (F and B sets are equal within a stage already).
  for (int s = 1; s < p; ++s) {
    for (const auto& [j, pos] : index[s].forward) {
      if (index[0].forward.count(j) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, ": ", ToString(F(j)), " is not a micro-batch of stage 0"));
      }
    }
    for (const auto& [j, pos] : index[0].forward) {
      if (index[s].forward.count(j) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, ": ", ToString(F(j)), " missing (stage 0 has it)"));
      }
    }
  }
  for (int s = 0; s + 1 < p; ++s) {
    PT_RETURN_IF_ERROR(CheckMatched(index[s].send_act, ActionKind::kSendActivation, s,
                                    index[s + 1].recv_act, ActionKind::kRecvActivation, s + 1));
    PT_RETURN_IF_ERROR(CheckMatched(index[s + 1].send_grad, ActionKind::kSendGradient, s + 1,
                                    index[s].recv_grad, ActionKind::kRecvGradient, s));
  }
  return index;
}

}  // namespace

CostModel CostModel::Uniform(double t_f, double t_b) {
  CostModel cost;
  cost.duration = [t_f, t_b](int /*stage*/, const Action& action) {
    switch (action.kind) {
      case ActionKind::kForward: return t_f;
      case ActionKind::kBackward: return t_b;
      default: return 0.0;
    }
  };
  return cost;
}

absl::Status CheckSchedule(const std::vector<std::vector<Action>>& stages) {
  return IndexAndCheck(stages).status();
}

absl::StatusOr<SimulationResult> Simulate(const std::vector<std::vector<Action>>& stages,
                                          const CostModel& cost) {
  const int p = static_cast<int>(stages.size());
  // The model stage of an action of rank r's list, and the rank that holds each model stage.
  const auto stage_of = [](const Action& a, int r) { return a.stage == kOwnStage ? r : a.stage; };
  std::map<int, int> holder;
  bool staged = false, negative = false;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : stages[r]) {
      holder[stage_of(a, r)] = r;
      staged = staged || a.stage != kOwnStage;
      negative = negative || a.index < 0;
    }
  }
  if (staged) {
    if (negative) return absl::InvalidArgumentError("a negative micro-batch or step index");
  } else {
    PT_RETURN_IF_ERROR(IndexAndCheck(stages).status());
  }
  if (!cost.duration) return absl::InvalidArgumentError("cost model has no duration function");
  if (!(cost.link_latency_s >= 0.0) || !std::isfinite(cost.link_latency_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("link latency must be finite and >= 0: got ", cost.link_latency_s));
  }

  SimulationResult result;
  result.timeline.resize(p);
  result.peak_in_flight.resize(p);
  result.busy_s.assign(p, 0.0);
  result.step_end_s.resize(p);
  for (int r = 0; r < p; ++r) {
    result.timeline[r].reserve(stages[r].size());
    result.peak_in_flight[r] = PeakInFlight(stages[r]);
    int64_t last_step = -1;
    for (const Action& a : stages[r]) {
      if (a.kind == ActionKind::kOptimizerStep) last_step = std::max(last_step, a.index);
    }
    if (last_step >= 0) result.step_end_s[r].assign(last_step + 1, -1.0);
  }

  // End time of each executed SEND by (sending model stage, micro-batch): activations and
  // gradients.
  std::map<std::pair<int, int64_t>, double> act_sent, grad_sent;
  std::vector<size_t> pc(p, 0);
  std::vector<double> free_at(p, 0.0);
  size_t remaining = 0;
  for (const auto& list : stages) remaining += list.size();

  while (remaining > 0) {
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      while (pc[r] < stages[r].size()) {
        const Action& a = stages[r][pc[r]];
        const int k = stage_of(a, r);
        double start = free_at[r];
        if (a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kRecvGradient) {
          const bool act = a.kind == ActionKind::kRecvActivation;
          const auto& sent = act ? act_sent : grad_sent;
          auto it = sent.find({act ? k - 1 : k + 1, a.index});
          if (it == sent.end()) break;  // blocked until the peer sends
          start = std::max(start, it->second + cost.link_latency_s);
        }
        const double d = cost.duration(r, a);
        if (!(d >= 0.0) || !std::isfinite(d)) {
          return absl::InvalidArgumentError(absl::StrCat("cost model gives ", ToString(a),
                                                         " on stage ", r, " the duration ", d,
                                                         "; durations must be finite and >= 0"));
        }
        const double end = start + d;
        if (a.kind == ActionKind::kSendActivation) act_sent[{k, a.index}] = end;
        if (a.kind == ActionKind::kSendGradient) grad_sent[{k, a.index}] = end;
        if (a.kind == ActionKind::kOptimizerStep) result.step_end_s[r][a.index] = end;
        result.timeline[r].push_back({a, start, end});
        result.busy_s[r] += d;
        result.makespan_s = std::max(result.makespan_s, end);
        free_at[r] = end;
        ++pc[r];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      std::vector<std::string> stuck;
      for (int r = 0; r < p; ++r) {
        if (pc[r] >= stages[r].size()) continue;
        const Action& a = stages[r][pc[r]];
        const int from = stage_of(a, r) + (a.kind == ActionKind::kRecvActivation ? -1 : 1);
        const auto it = holder.find(from);
        const int peer = it == holder.end() ? from : it->second;
        std::string peer_at = peer >= 0 && peer < p && pc[peer] < stages[peer].size()
                                  ? absl::StrCat("at ", ToString(stages[peer][pc[peer]]))
                                  : "done";
        stuck.push_back(absl::StrCat("stage ", r, " waits at ", ToString(a), " (action ", pc[r],
                                     ") for stage ", peer, " (", peer_at, ")"));
      }
      return absl::FailedPreconditionError(absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; ")));
    }
  }
  return result;
}

int PeakInFlight(const std::vector<Action>& actions) {
  int in_flight = 0;
  int peak = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    if (a.kind == ActionKind::kBackward) --in_flight;
  }
  return peak;
}

std::string FormatGrid(const std::vector<std::vector<Action>>& stages) {
  const int width = static_cast<int>(absl::StrCat(stages.empty() ? 0 : stages.size() - 1).size());
  std::string out;
  for (size_t s = 0; s < stages.size(); ++s) {
    absl::StrAppendFormat(&out, "s%-*d |", width, static_cast<int>(s));
    if (!stages[s].empty()) absl::StrAppend(&out, " ", FormatActions(stages[s]));
    out += '\n';
  }
  return out;
}

}  // namespace pipetrain::schedule
