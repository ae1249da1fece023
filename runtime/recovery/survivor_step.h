// The step the surviving ranks of a job go on from after some rank was lost, and who supplies
// each rank's state: no step is lost when another replica of each lost rank survives.
//
// The hazard: without coordination, ranks apply the update of mini-batch t as soon as their
// own gradient is final, so a fault can leave one stage updated and another not, and no
// replica's weights form one consistent step. The executor's step commit
// (executor::StageConfig::commit_steps) closes it: a rank applies update t only after every
// rank of every replica holds t's final gradient (averaged over all replicas, tied copies
// summed, clipped). So after a fault, if any survivor applied update t, every survivor holds
// t's final gradient: applied (`next_step` past t) or held (`held_step` == t).
// The survivors go on from the newest step that every place in the pipeline has a survivor
// standing at or holding the update to: the step in progress is completed rather than redone
// whenever every place holds its final gradient, though no rank got to apply it. Those
// holding its update apply it first; survivors that cannot reach it are passed over.
// Pure functions: thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::recovery {

// Where one rank's weights stand (executor::StageExecutor::commit_state()).
struct CommitState {
  // The updates applied so far are those of mini-batches before this one: the rank's newest
  // weights are W(next_step). The job's first step (0, or where it resumed) before any.
  int64_t next_step = 0;
  // A mini-batch whose final gradient the rank holds without having applied it (its commit
  // began and did not end); -1: none.
  int64_t held_step = -1;
  // On a rank of the last model stage holding one: that mini-batch's loss as the job reports
  // it (the mean over the replicas), which it learned before its gradient was final.
  std::optional<double> held_loss;
};

// A rank that survived: its place in its pipeline (0 .. ranks − 1), its replica, its state.
struct Survivor {
  int rank = 0;
  int replica = 0;
  CommitState state;
};

struct SurvivorPlan {
  // The survivors go on from W(step): mini-batch `step` is the next to run.
  int64_t step = 0;
  // Indices into the survivors that apply their held update of mini-batch step − 1 first.
  std::vector<int> apply_held;
  // For each place in the pipeline, the survivor (index) whose state the next layout's ranks
  // of that place start from: the lowest replica among those that reach `step`.
  std::vector<int> sources;
};

// The plan for `survivors` of a job of `ranks` places per pipeline. Errors
// (FailedPrecondition, every reason):
// - a place of which no replica survived ("no replica of stage 1 survived"): the job can go
//   on only from a checkpoint;
// - no step that every place's survivors can stand at (each place's steps named): their
//   updates were not committed (the step commit was off);
// - a survivor naming a rank outside the pipeline.
absl::StatusOr<SurvivorPlan> PlanSurvivorStep(const std::vector<Survivor>& survivors, int ranks);

}  // namespace pipetrain::recovery
