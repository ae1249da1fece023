// See survivor_step.h.
#include "runtime/recovery/survivor_step.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::recovery {
namespace {

// Whether a rank in `state` can stand at W(step): it does, or holds the update that gets it
// there.
bool Reaches(const CommitState& state, int64_t step) {
  return state.next_step == step || (state.next_step == step - 1 && state.held_step == step - 1);
}

}  // namespace

absl::StatusOr<SurvivorPlan> PlanSurvivorStep(const std::vector<Survivor>& survivors, int ranks) {
  std::vector<std::string> violations;
  std::vector<std::set<int64_t>> reachable(static_cast<size_t>(std::max(ranks, 0)));
  std::set<int64_t> candidates;
  for (size_t i = 0; i < survivors.size(); ++i) {
    const Survivor& s = survivors[i];
    if (s.rank < 0 || s.rank >= ranks) {
      violations.push_back(absl::StrCat("survivor ", i, " names rank ", s.rank, " of ", ranks));
      continue;
    }
    std::set<int64_t>& steps = reachable[static_cast<size_t>(s.rank)];
    steps.insert(s.state.next_step);
    if (s.state.held_step == s.state.next_step) steps.insert(s.state.next_step + 1);
    candidates.insert(steps.begin(), steps.end());
  }
  for (int r = 0; r < ranks; ++r) {
    if (reachable[static_cast<size_t>(r)].empty()) {
      violations.push_back(absl::StrCat("no replica of stage ", r, " survived"));
    }
  }
  // The newest step every place can stand at.
  std::optional<int64_t> step;
  if (violations.empty()) {
    for (auto s = candidates.rbegin(); s != candidates.rend() && !step; ++s) {
      if (std::all_of(reachable.begin(), reachable.end(),
                      [&](const std::set<int64_t>& r) { return r.count(*s) > 0; })) {
        step = *s;
      }
    }
    if (!step) {
      std::vector<std::string> places;
      for (int r = 0; r < ranks; ++r) {
        places.push_back(absl::StrCat("stage ", r, " at step ",
                                      absl::StrJoin(reachable[static_cast<size_t>(r)], " or ")));
      }
      violations.push_back(absl::StrCat("no step is one every stage's survivors can stand at (",
                                        absl::StrJoin(places, "; "),
                                        "): the updates were not committed"));
    }
  }
  if (!violations.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the survivors cannot go on without a checkpoint: ", absl::StrJoin(violations, "; ")));
  }
  SurvivorPlan plan;
  plan.step = *step;
  plan.sources.assign(static_cast<size_t>(ranks), -1);
  for (size_t i = 0; i < survivors.size(); ++i) {
    const Survivor& s = survivors[i];
    if (!Reaches(s.state, plan.step)) continue;
    if (s.state.next_step != plan.step) plan.apply_held.push_back(static_cast<int>(i));
    int& source = plan.sources[static_cast<size_t>(s.rank)];
    if (source < 0 || survivors[static_cast<size_t>(source)].replica > s.replica) {
      source = static_cast<int>(i);
    }
  }
  return plan;
}

}  // namespace pipetrain::recovery
