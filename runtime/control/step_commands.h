// Commands that take effect at a named step boundary, so that the control plane never
// stalls the pipeline (docs/design.md sections 1 and 6).
//
// Boundary N is the point between mini-batch N-1 and mini-batch N (0 < N < steps). A
// command at boundary N means, on every stage of every replica:
//   flush      the pipeline drains: every backward of mini-batches < N and the update of
//              mini-batch N-1 are done before the first forward of mini-batch N. The
//              weights are unchanged (2BW keeps its 1-step-stale rule); GPipe and 1F1B
//              already drain at every boundary.
//   switch     flush, and mini-batch N runs on the newest weights W(N) instead of W(N-1):
//              from N on, micro-batch j uses version max(floor(j/m) - 1, N) (2BW); one
//              version lives at the boundary. No effect on the math of GPipe and 1F1B.
//   checkpoint flush, and every stage hands its weights W(N) to its host at the boundary,
//              with W(N-1) where mini-batch N runs on it (2BW): the math is unchanged, a
//              job resumed from it continues the 1-step-stale trajectory (pipedream's drain
//              itself starts every stage on its newest version).
//   stop       flush; the job ends after mini-batch N-1 (its result is that of an N-step job).
//
// How a command reaches every stage without waiting on anyone:
//   - The host of stage 0 of replica 0 puts it in this queue (Schedule, any thread).
//   - Stage 0 of every replica closes boundary N (Seal) when it finishes its update of
//     mini-batch N-2 (N − 1 − ceil(p/m) under pipedream with m < p, whose stage 0 sends the
//     last activation of mini-batch N-1 that many updates before N; the boundaries before
//     the first such one it seals when it starts); with replicas, the stage-0 ranks combine
//     what they sealed in a small AllReduce right there, so every replica applies the same
//     commands.
//   - Each stage passes the sealed set of boundary N to the next stage with the activation of
//     micro-batch N*m - 1 (the last of mini-batch N-1). In every schedule that is before the
//     first action that the commands change, so no stage ever waits for a command.
// A command for a boundary that is already sealed is refused (FailedPrecondition naming the
// earliest boundary still open); nothing is applied halfway.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::control {

// A set of commands at one boundary, as bits.
enum StepCommand : uint32_t {
  kFlush = 1u << 0,
  kSwitchVersion = 1u << 1,
  kCheckpoint = 1u << 2,
  kStop = 1u << 3,
};
constexpr uint32_t kAllStepCommands = kFlush | kSwitchVersion | kCheckpoint | kStop;

// "flush", "switch", "checkpoint", "stop"; a set prints as "flush+stop", none as "".
std::string StepCommandsName(uint32_t commands);
// One name (also "switch-version"); the error lists the accepted names.
absl::StatusOr<StepCommand> ParseStepCommand(std::string_view name);

// Whether a set changes the action list (every command drains the pipeline) or the weight
// version rule (switch only).
inline bool DrainsPipeline(uint32_t commands) { return commands != 0; }
inline bool SwitchesToNewest(uint32_t commands) { return (commands & kSwitchVersion) != 0; }

class StepCommandQueue {
 public:
  // `steps`: the job's mini-batch count; boundaries 1..steps-1 exist. Boundary
  // first_step + 1 is sealed from the start (stage 0 begins that mini-batch's micro-batches
  // before any update); first_step > 0 for a resumed job.
  explicit StepCommandQueue(int64_t steps, int64_t first_step = 0);

  // Adds `command` at boundary `step`, or at the earliest open boundary if `step` is 0.
  // Returns the boundary. InvalidArgument for a boundary outside [1, steps) or an unknown
  // command; FailedPrecondition if the boundary is sealed (the message names the earliest
  // open one) or the job was stopped at an earlier boundary.
  absl::StatusOr<int64_t> Schedule(uint32_t command, int64_t step);

  // A resumed job starts at `first_step`: boundaries up to first_step + 1 are closed.
  void StartAt(int64_t first_step);

  // Stage 0's thread: closes boundary `step` to new commands and returns its commands.
  uint32_t Seal(int64_t step);

  // The earliest boundary that still accepts commands (steps if none).
  int64_t earliest_open() const;

 private:
  mutable absl::Mutex mu_;
  const int64_t steps_;
  int64_t sealed_through_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, uint32_t> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::control
