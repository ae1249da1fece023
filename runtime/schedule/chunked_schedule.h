// The schedules that flush, as one step's lists of compute actions: GPipe and 1F1B
// (PipeDream-Flush), one chunk a rank, and the kinds whose ranks hold several model chunks
// (virtual stages): interleaved 1F1B (Megatron's virtual pipeline), zero-bubble with the
// backward split into I (input gradient) and W (weight gradient) — ZB-H1, its interleaved
// form, ZB-V — and DualPipeV. docs/design.md section 3.1 has each rule with its source.
//
// The model is cut into v x p chunks (v = 1 for GPipe and 1F1B), numbered as global stages
// 0 .. v·p−1 in model order. Each rank's list names the stage of every action ("2F0": the
// forward of micro-batch 0 through stage 2, action.h). The lists cover one step
// (micro-batches 0 .. m−1, every rank's backward done before the step's update); communication
// is not in them (compute_lists.h checks and simulates them; communication.h adds the
// messages). Every flushing kind's list in schedule.h is made from these: one generator, one
// lowering.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::schedule {

struct ChunkLayout {
  ChunkPlacement placement = ChunkPlacement::kLoop;
  int ranks = 1;            // p
  int chunks_per_rank = 1;  // v (2 under kV)

  int stages() const { return ranks * chunks_per_rank; }
  // REQUIRES: 0 <= stage < stages().
  int RankOf(int stage) const;
  // The stages rank r holds, in model order.
  std::vector<int> StagesOf(int rank) const;
  // The number of the message of micro-batch j across the boundary between model stages
  // `lower` and lower + 1 (transport::Transport): j x v + floor(lower / p), so that two
  // boundaries a pair of ranks shares never share a number; j itself with one stage a rank.
  int64_t MessageNumber(int lower, int64_t j) const { return j * chunks_per_rank + lower / ranks; }
  // The micro-batch the message numbered `number` carries.
  int64_t MicroBatchOfMessage(int64_t number) const { return number / chunks_per_rank; }
};

// The chunk layout a schedule runs on (ScheduleParams: kind, stages = p ranks,
// virtual_stages): the kind's placement (ScheduleTraits), 2 chunks a rank under V, one stage a
// rank for the kinds without chunks.
ChunkLayout LayoutOf(const ScheduleParams& params);

// For a kind that HoldsChunks, the rules of its chunks (ValidateScheduleParams checks them
// with the rest): every violated rule, "; "-separated, in one InvalidArgument, each naming
// it: v >= 1; interleaved v >= 2; loop placements
// (interleaved, zb1p with v >= 2) m a multiple of rounds = max(1, floor(m / p)); zbv and
// dualpipev v = 2; dualpipev m >= 2p.
absl::Status ValidateChunkedParams(const ScheduleParams& params);

// Every rank's list (index = rank) for one step: F, B, I and W actions with their stages,
// micro-batches 0 .. m−1. `params` (valid: ValidateScheduleParams) names a kind that flushes
// (not RunsContinuously: 2bw and pipedream have no one-step list, InvalidArgument); its steps
// do not matter.
absl::StatusOr<std::vector<std::vector<Action>>> BuildComputeLists(const ScheduleParams& params);

}  // namespace pipetrain::schedule
