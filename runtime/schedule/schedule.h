// Pipeline schedules as pure functions: (kind, p, m, steps, stage) -> that stage's actions.
//
// Placement of communication (identical for every kind):
//   stage s > 0 receives RECV_ACT<j> right before F<j>;
//   stage s < p-1 sends SEND_ACT<j> right after F<j>;
//   stage s < p-1 receives RECV_GRAD<j> right before B<j>;
//   stage s > 0 sends SEND_GRAD<j> right after B<j>.
// The last stage computes the loss inside F<j> (its labels are delivered to it) and starts
// B<j> from that loss. Sends never block; receives block until the matching send.
//
// Kinds (docs/design.md section 3):
//   kGPipe    : per step, all F in order, then all B in order, then STEP<t> (flush).
//   kOneFOneB : PipeDream-Flush. Per step, warm-up of min(p-s-1, m) forwards, then
//               (F, B) pairs, then the remaining backwards, then STEP<t> (flush).
//               This is also Hippie's "last-stage schedule" (docs/design.md section 5): the
//               last stage runs B<j> right after F<j>, holding one micro-batch in flight,
//               and stage s holds at most p-s.
//   kTwoBW    : PipeDream-2BW. One continuous 1F1B over steps*m micro-batches with no flush;
//               warm-up min(p-s-1, steps*m) forwards; STEP<t> right after the stage's last
//               backward of mini-batch t. Requires m >= p. With `flush_before` = {N, ...},
//               the 1F1B runs piecewise: mini-batches [0, N) drain completely (as one
//               2BW job of N steps would end) before mini-batch N starts with a fresh
//               warm-up. Until the last micro-batch of mini-batch N-1 the lists are
//               identical to those without the flush.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"

namespace pipetrain::schedule {

enum class ScheduleKind { kGPipe, kOneFOneB, kTwoBW };

// "gpipe", "1f1b", "2bw".
std::string_view ScheduleKindName(ScheduleKind kind);
// Accepts the names above (case-insensitive) and the aliases "flush", "pipedream-flush",
// "last-stage" (all kOneFOneB) and "pipedream-2bw". The error lists the accepted names.
absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name);

struct ScheduleParams {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;         // p >= 1
  int micro_batches = 1;  // m >= 1 per step per pipeline
  int steps = 1;          // mini-batches covered by the generated lists, >= 1
  // Boundaries (0 < N < steps) where the pipeline drains before mini-batch N starts (step
  // commands, runtime/control). GPipe and 1F1B drain at every boundary anyway.
  std::vector<int64_t> flush_before = {};
};

// All violations, "; "-separated, in one InvalidArgument: p < 1, m < 1, steps < 1, a
// flush_before boundary outside (0, steps), and for kTwoBW m < p ("2bw needs micro_batches >= stages: got m=2 < p=4").
absl::Status ValidateScheduleParams(const ScheduleParams& params);

// The action list of stage `stage` (0 <= stage < p).
absl::StatusOr<std::vector<Action>> BuildStageSchedule(const ScheduleParams& params, int stage);
// All stages' lists, index = stage.
absl::StatusOr<std::vector<std::vector<Action>>> BuildSchedule(const ScheduleParams& params);

// PipeDream-2BW: the weight version used by every F and B of global micro-batch j,
// max(floor(j/m) - 1, 0).
inline int64_t TwoBWVersionForMicroBatch(int64_t j, int m) {
  const int64_t v = j / m - 1;
  return v < 0 ? 0 : v;
}

}  // namespace pipetrain::schedule
