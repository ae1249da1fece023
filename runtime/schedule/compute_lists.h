// Checks and simulates the per-rank compute lists of schedules whose ranks hold several
// chunks (chunked_schedule.h): the oracle their golden lists and bubbles are tested with.
//
// Checked (InvalidArgument naming the rank and the action): every action names a stage its
// rank holds; per stage, every micro-batch 0 .. m−1 has one F and either one B or one I and
// one W, nothing else and nothing twice; a backward (B or I) after its F, a W after its I.
//
// Simulated: each rank runs its list in order, one action at a time; an action starts when
// its rank is free and what it needs is done: F<j> on stage s > 0 the F<j> of stage s − 1;
// a backward (B or I) of stage s its F<j> and, below the last stage, the backward of stage
// s + 1 (the input gradient it receives); W<j> its I<j>. Communication costs nothing (on
// one rank or between ranks alike). A rank that cannot go on while others cannot either is a
// deadlock: FailedPrecondition naming what each waits for.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/chunked_schedule.h"

namespace pipetrain::schedule {

absl::Status CheckComputeLists(const ChunkLayout& layout, int micro_batches,
                               const std::vector<std::vector<Action>>& lists);

// Seconds per action of each kind (the same on every stage).
struct ComputeCosts {
  double forward = 1, backward = 2, input_gradient = 1, weight_gradient = 1;
};

struct ComputeSimulation {
  double makespan = 0;         // end of the last action on any rank
  std::vector<double> busy;    // per rank: the sum of its actions' costs
  std::vector<int> peak_live;  // per rank: PeakLive of its list
  // The idle share of the ranks' time: 1 − sum(busy) / (ranks x makespan).
  double bubble() const;
};

// CheckComputeLists, then the simulation.
absl::StatusOr<ComputeSimulation> SimulateComputeLists(
    const ChunkLayout& layout, int micro_batches, const std::vector<std::vector<Action>>& lists,
    const ComputeCosts& costs = {});

// The most chunk-micro-batches a list holds at once: max over its prefixes of #F − #(B or I)
// (a micro-batch's stash lives from its F to its backward; after I only what W needs stays).
int PeakLive(const std::vector<Action>& list);

// FailedPrecondition "deadlock: rank 0 waits at 0I0; rank 1 waits at 1F1": each rank whose
// list is not done (next[r] < its size), at its next action.
absl::Status DeadlockError(const std::vector<std::vector<Action>>& lists,
                           const std::vector<size_t>& next);

// One line per rank, "r0: 0F0 0F1 2F0 ...", as the golden lists are written.
std::string FormatRankLists(const std::vector<std::vector<Action>>& lists);

}  // namespace pipetrain::schedule
