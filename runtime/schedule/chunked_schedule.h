// Schedules whose ranks hold several model chunks (virtual stages), as lists of compute
// actions: interleaved 1F1B (Megatron's virtual pipeline), zero-bubble with the backward
// split into I (input gradient) and W (weight gradient) — ZB-H1, its interleaved form, ZB-V —
// and DualPipeV. docs/design.md section 3.1 has each rule with its source.
//
// The model is cut into v x p chunks, numbered as global stages 0 .. v·p−1 in model order.
// Each rank's list names the stage of every action ("2F0": the forward of micro-batch 0
// through stage 2, action.h). The lists cover one step (micro-batches 0 .. m−1, every rank's
// backward done before the step's update: these schedules flush); communication is not in
// them (compute_lists.h checks and simulates them; communication.h adds the messages).
//
// Pure functions; thread-safe.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"

namespace pipetrain::schedule {

// Where the chunks go:
//   kLoop  stage s on rank s mod p (rank r holds r, r + p, r + 2p, ...);
//   kV     two chunks a rank, rank r holds stages r and 2p−1−r: the first and the last
//          stage share rank 0, and the middle two (p−1, p) rank p−1, handing over locally.
enum class ChunkPlacement { kLoop, kV };

struct ChunkLayout {
  ChunkPlacement placement = ChunkPlacement::kLoop;
  int ranks = 1;            // p
  int chunks_per_rank = 1;  // v (2 under kV)

  int stages() const { return ranks * chunks_per_rank; }
  // REQUIRES: 0 <= stage < stages().
  int RankOf(int stage) const;
  // The stages rank r holds, in model order.
  std::vector<int> StagesOf(int rank) const;
};

enum class ChunkedKind {
  kInterleaved,  // interleaved 1F1B, loop placement
  kZeroBubble,   // ZB-H1 (v = 1) or interleaved zero-bubble (v >= 2), loop placement
  kZeroBubbleV,  // ZB-V: V placement
  kDualPipeV,    // DualPipeV: V placement
};

// "interleaved", "zb1p", "zbv", "dualpipev".
std::string_view ChunkedKindName(ChunkedKind kind);

struct ChunkedParams {
  ChunkedKind kind = ChunkedKind::kInterleaved;
  int ranks = 1;           // p >= 1
  int virtual_stages = 2;  // v chunks per rank; kZeroBubbleV and kDualPipeV take 2
  int micro_batches = 1;   // m >= 1 per step
};

// The chunk layout the kind runs on.
ChunkLayout LayoutOf(const ChunkedParams& params);

// Every violated rule, "; "-separated, in one InvalidArgument, each naming its rule:
// p >= 1, m >= 1; interleaved v >= 2; loop placements (interleaved, zb1p with v >= 2) m a
// multiple of rounds = max(1, floor(m / p)); zbv and dualpipev v = 2; dualpipev m >= 2p.
absl::Status ValidateChunkedParams(const ChunkedParams& params);

// Every rank's list (index = rank) for one step: F, B, I and W actions with their stages,
// micro-batches 0 .. m−1.
absl::StatusOr<std::vector<std::vector<Action>>> BuildComputeLists(const ChunkedParams& params);

}  // namespace pipetrain::schedule
