// See survivor_step.h.
#include "runtime/recovery/survivor_step.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::recovery {

absl::StatusOr<SurvivorPlan> PlanSurvivorStep(const std::vector<Survivor>& survivors,
                                              int ranks) {
  std::vector<std::string> violations;
  SurvivorPlan plan;
  plan.sources.assign(static_cast<size_t>(std::max(ranks, 0)), -1);
  for (size_t i = 0; i < survivors.size(); ++i) {
    const Survivor& s = survivors[i];
    if (s.rank < 0 || s.rank >= ranks) {
      violations.push_back(absl::StrCat("survivor ", i, " names rank ", s.rank, " of ", ranks));
      continue;
    }
    plan.step = std::max(plan.step, s.state.next_step);
    int& source = plan.sources[static_cast<size_t>(s.rank)];
    if (source < 0 || survivors[static_cast<size_t>(source)].replica > s.replica) {
      source = static_cast<int>(i);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    if (plan.sources[static_cast<size_t>(r)] < 0) {
      violations.push_back(absl::StrCat("no replica of rank ", r, " survived"));
    }
  }
  for (size_t i = 0; i < survivors.size(); ++i) {
    const Survivor& s = survivors[i];
    if (s.rank < 0 || s.rank >= ranks || s.state.next_step == plan.step) continue;
    if (s.state.next_step == plan.step - 1 && s.state.held_step == plan.step - 1) {
      plan.apply_held.push_back(static_cast<int>(i));
      continue;
    }
    violations.push_back(absl::StrCat(
        "rank ", s.rank, " of replica ", s.replica, " has applied the updates before step ",
        s.state.next_step,
        s.state.held_step >= 0 ? absl::StrCat(" and holds step ", s.state.held_step, "'s")
                               : std::string(" and holds none"),
        " while another survivor applied step ", plan.step - 1,
        "'s (its updates were not committed)"));
  }
  if (!violations.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the survivors cannot go on without a checkpoint: ",
                     absl::StrJoin(violations, "; ")));
  }
  return plan;
}

}  // namespace pipetrain::recovery
