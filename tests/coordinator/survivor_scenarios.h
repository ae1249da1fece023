// Survivors' rounds the coordinator's pure tests share (survivor_round_test,
// survivor_hold_test): a rank's commit state in one call, and one 2 x 3 round.
#pragma once

#include <cstdint>
#include <optional>

#include "coordinator/survivor_round.h"
#include "runtime/recovery/survivor_step.h"

namespace pipetrain::coordinator::scenarios {

inline recovery::CommitState At(int64_t next_step, int64_t held_step = -1,
                                std::optional<double> held_loss = std::nullopt) {
  recovery::CommitState s;
  s.next_step = next_step;
  s.held_step = held_step;
  s.held_loss = held_loss;
  return s;
}

// 2 stages x 3 replicas, undecided: stage 0 holds layers 0 and 1, stage 1 layer 2. Rank 0
// holds step 7's update, ranks 1, 2 and 3 stand at step 8, rank 4 (stage 0 of replica 2) is
// at step 7 without the update, rank 5 is gone. Decided, it goes on from step 8 with ranks 0
// (after its held update), 1, 2 and 3 holding their layers.
inline SurvivorRound OneBehindOneGone() {
  SurvivorRound round(/*ranks=*/6, /*stages=*/2);
  round.Report(0, At(7, 7), {0, 1});
  round.Report(1, At(8), {2});
  round.Report(2, At(8), {0, 1});
  round.Report(3, At(8), {2});
  round.Report(4, At(7), {0, 1});
  round.Gone(5);
  return round;
}

}  // namespace pipetrain::coordinator::scenarios
