#include "runtime/schedule/compute_lists.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/schedule/action_table.h"

namespace pipetrain::schedule {

absl::Status CheckComputeLists(const ChunkLayout& layout, int micro_batches,
                               const std::vector<std::vector<Action>>& lists) {
  if (static_cast<int>(lists.size()) != layout.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat(lists.size(), " lists for ", layout.ranks, " ranks"));
  }
  ActionTable<char> seen(layout.stages(), micro_batches, false);
  for (int r = 0; r < layout.ranks; ++r) {
    const auto error = [r](const Action& a, auto&&... why) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": ", ToString(a), " ", why...));
    };
    for (const Action& a : lists[r]) {
      if (!IsCompute(a.kind)) return error(a, "is not a compute action (F, B, I, W)");
      if (a.stage < 0 || a.stage >= layout.stages() || layout.RankOf(a.stage) != r) {
        return error(a, "names a stage rank ", r, " does not hold");
      }
      if (a.index < 0 || a.index >= micro_batches) {
        return error(a, "is outside micro-batches 0 .. ", micro_batches - 1);
      }
      if (seen.Get(a)) return error(a, "comes twice");
      seen.Set(a, true);
      const auto done = [&](ActionKind kind) { return seen.Get(kind, a.stage, a.index); };
      if (IsBackward(a.kind) && !done(ActionKind::kForward)) {
        return error(a, "comes before its forward");
      }
      if (a.kind == ActionKind::kWeightGradient && !done(ActionKind::kInputGradient)) {
        return error(a, "comes before its I");
      }
      if (a.kind == ActionKind::kInputGradient && done(ActionKind::kBackward)) {
        return error(a, "splits a backward already run whole");
      }
      if (a.kind == ActionKind::kBackward && done(ActionKind::kInputGradient)) {
        return error(a, "runs whole a backward already split");
      }
    }
  }
  for (int s = 0; s < layout.stages(); ++s) {
    for (int64_t j = 0; j < micro_batches; ++j) {
      const auto has = [&](ActionKind kind) { return seen.Get(kind, s, j); };
      const Action f = OnStage(F(j), s);
      if (!has(ActionKind::kForward)) {
        return absl::InvalidArgumentError(absl::StrCat("stage ", s, ": no ", ToString(f)));
      }
      if (!has(ActionKind::kBackward) && !has(ActionKind::kInputGradient)) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, ": no backward (B or I) of micro-batch ", j));
      }
      if (has(ActionKind::kInputGradient) && !has(ActionKind::kWeightGradient)) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", s, ": ", ToString(OnStage(I(j), s)), " has no W"));
      }
    }
  }
  return absl::OkStatus();
}

double ComputeSimulation::bubble() const {
  double sum = 0;
  for (const double b : busy) sum += b;
  return busy.empty() || makespan <= 0 ? 0 : 1 - sum / (busy.size() * makespan);
}

absl::StatusOr<ComputeSimulation> SimulateComputeLists(
    const ChunkLayout& layout, int micro_batches, const std::vector<std::vector<Action>>& lists,
    const ComputeCosts& costs) {
  if (absl::Status s = CheckComputeLists(layout, micro_batches, lists); !s.ok()) return s;
  const int p = layout.ranks, last = layout.stages() - 1;
  const auto cost = [&](ActionKind kind) {
    switch (kind) {
      case ActionKind::kForward: return costs.forward;
      case ActionKind::kBackward: return costs.backward;
      case ActionKind::kInputGradient: return costs.input_gradient;
      default: return costs.weight_gradient;
    }
  };
  ActionTable<double> end(layout.stages(), micro_batches, -1);  // actions done: their end
  const auto ended = [&](ActionKind kind, int stage, int64_t j) -> const double* {
    const double& at = end.Get(kind, stage, j);
    return at < 0 ? nullptr : &at;
  };
  // The backward of (stage, j) in either form.
  const auto backward_end = [&](int stage, int64_t j) -> const double* {
    const double* b = ended(ActionKind::kBackward, stage, j);
    return b != nullptr ? b : ended(ActionKind::kInputGradient, stage, j);
  };
  // When `a` may start as far as its inputs go; null while one is not done.
  const auto ready_at = [&](const Action& a) -> const double* {
    static const double kZero = 0;
    switch (a.kind) {
      case ActionKind::kForward:
        return a.stage == 0 ? &kZero : ended(ActionKind::kForward, a.stage - 1, a.index);
      case ActionKind::kWeightGradient: return ended(ActionKind::kInputGradient, a.stage, a.index);
      default: {
        const double* own = ended(ActionKind::kForward, a.stage, a.index);
        if (a.stage == last || own == nullptr) return own;
        const double* above = backward_end(a.stage + 1, a.index);
        if (above == nullptr) return nullptr;
        return *above > *own ? above : own;
      }
    }
  };
  ComputeSimulation out;
  out.busy.assign(p, 0);
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < lists[r].size()) {
        const Action& a = lists[r][next[r]];
        const double* ready = ready_at(a);
        if (ready == nullptr) break;
        const double start = std::max(free_at[r], *ready);
        free_at[r] = start + cost(a.kind);
        end.Set(a, free_at[r]);
        out.busy[r] += cost(a.kind);
        ++next[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[r] < lists[r].size()) return DeadlockError(lists, next);
  }
  for (int r = 0; r < p; ++r) {
    out.makespan = std::max(out.makespan, free_at[r]);
    out.peak_live.push_back(PeakLive(lists[r]));
  }
  return out;
}

absl::Status DeadlockError(const std::vector<std::vector<Action>>& lists,
                           const std::vector<size_t>& next) {
  std::vector<std::string> stuck;
  for (size_t r = 0; r < lists.size(); ++r) {
    if (next[r] < lists[r].size()) {
      stuck.push_back(absl::StrCat("rank ", r, " waits at ", ToString(lists[r][next[r]])));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("deadlock: ", absl::StrJoin(stuck, "; ")));
}

int PeakLive(const std::vector<Action>& list) {
  int live = 0, peak = 0;
  for (const Action& a : list) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++live);
    if (IsBackward(a.kind)) --live;
  }
  return peak;
}

std::string FormatRankLists(const std::vector<std::vector<Action>>& lists) {
  std::string out;
  for (size_t r = 0; r < lists.size(); ++r) {
    absl::StrAppend(&out, "r", r, ": ", FormatActions(lists[r]), "\n");
  }
  return out;
}

}  // namespace pipetrain::schedule
