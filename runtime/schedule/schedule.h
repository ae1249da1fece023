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
//   kPipeDream: PipeDream with weight stashing: 2BW's lists (any m), its weights differing
//               (each forward on the stage's newest version, its backward on the same one:
//               runtime/weights/weight_store.h MakeStashedWeights).
//   Schedules whose ranks hold several model chunks (virtual stages): kInterleaved
//   (interleaved 1F1B), kZeroBubble (ZB-H1; interleaved zero-bubble with v >= 2),
//   kZeroBubbleV (ZB-V) and kDualPipeV. `stages` is then the number of ranks p, the model is
//   cut into `virtual_stages` x p stages, and every action names the stage it runs on
//   (action.h).
// Every kind that flushes (GPipe, 1F1B and the kinds with chunks) is made one way: each step
// is the rank's one-step compute list of chunked_schedule.h with its messages
// (communication.h, which places them as above), its micro-batches numbered from t·m, then
// STEP<t>. 2BW and PipeDream run one 1F1B over the steps, generated here.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/schedule/action.h"

namespace pipetrain::schedule {

enum class ScheduleKind {
  kGPipe,
  kOneFOneB,
  kTwoBW,
  kPipeDream,    // PipeDream's weight stashing: 2BW's list, each F on its stage's newest weights
  kInterleaved,  // interleaved 1F1B (Megatron's virtual pipeline), loop placement
  kZeroBubble,   // ZB-H1 (v = 1) or interleaved zero-bubble (v >= 2), loop placement
  kZeroBubbleV,  // ZB-V: V placement
  kDualPipeV,    // DualPipeV: V placement
};

// Every kind, in the order above: what a sweep over all schedules iterates.
inline constexpr ScheduleKind kScheduleKinds[] = {
    ScheduleKind::kGPipe,       ScheduleKind::kOneFOneB,    ScheduleKind::kTwoBW,
    ScheduleKind::kPipeDream,   ScheduleKind::kInterleaved, ScheduleKind::kZeroBubble,
    ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV};

// Which weights a schedule's updates are computed on (docs/design.md section 3):
//   kFlush          one version: every micro-batch of step t runs on W(t), and the update
//                   follows a flush (the un-pipelined step's semantics);
//   kDoubleBuffered PipeDream-2BW: step t's micro-batches run on W(t − 1), and
//                   W(t + 1) = W(t) − step(∇f(W(t − 1))) (two versions a stage);
//   kStashed        PipeDream: each forward on the stage's newest version, its backward on
//                   the same one (stashed until then).
enum class WeightPolicy { kFlush, kDoubleBuffered, kStashed };

// Where the model chunks of a kind go (chunked_schedule.h):
//   kLoop  stage s on rank s mod p (rank r holds r, r + p, r + 2p, ...); one chunk a rank
//          for the kinds without chunks;
//   kV     two chunks a rank, rank r holds stages r and 2p−1−r: the first and the last
//          stage share rank 0, and the middle two (p−1, p) rank p−1, handing over locally.
enum class ChunkPlacement { kLoop, kV };

// What a kind is, in one record: the one place a new kind declares itself.
struct ScheduleTraits {
  ScheduleKind kind;
  std::string_view name;       // "gpipe", "1f1b", "2bw", "pipedream", "interleaved", "zb1p", ...
  bool holds_chunks;           // ranks hold model chunks named by their actions
  bool splits_backward;        // backwards split into I (input gradient) and W (weight gradient)
  bool runs_continuously;      // one 1F1B over every step with no flush
  int default_virtual_stages;  // chunks a rank when a job names none
  ChunkPlacement placement;
  WeightPolicy weights;
  // m >= this x p (0: any m): 2bw's warm-up fits in a step, DualPipeV's two directions fill.
  int micro_batches_per_rank;
  bool planned_by_auto;  // `stages: auto` (and the planners' shapes) search its layouts
};

// The traits of `kind`. REQUIRES: `kind` is one of kScheduleKinds.
const ScheduleTraits& TraitsOf(ScheduleKind kind);

// "gpipe", "1f1b", "2bw", "pipedream", "interleaved", "zb1p", "zbv", "dualpipev".
std::string_view ScheduleKindName(ScheduleKind kind);
// Accepts the names above (case-insensitive) and the aliases "flush", "pipedream-flush",
// "last-stage" (all kOneFOneB), "pipedream-2bw", "interleaved-1f1b", "zbh1", "zero-bubble" and
// "zb-v". The error lists the accepted names.
absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name);

// Shorthands of TraitsOf(kind):
bool HoldsChunks(ScheduleKind kind);
bool SplitsBackward(ScheduleKind kind);
bool RunsContinuously(ScheduleKind kind);
int DefaultVirtualStages(ScheduleKind kind);
WeightPolicy WeightsOf(ScheduleKind kind);

struct ScheduleParams {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;         // p >= 1: the pipeline's ranks (one stage each unless HoldsChunks)
  int micro_batches = 1;  // m >= 1 per step per pipeline
  int steps = 1;          // mini-batches covered by the generated lists, >= 1
  // Boundaries (first_step < N < steps) where the pipeline drains before mini-batch N starts
  // (step commands, runtime/control). GPipe and 1F1B drain at every boundary anyway.
  std::vector<int64_t> flush_before = {};
  // A resumed job: mini-batches before it ran earlier. The lists cover [first_step, steps),
  // the pipeline starting empty there, exactly as after a drain before first_step.
  int64_t first_step = 0;
  // v: model chunks a rank holds (HoldsChunks kinds; 1 for the others).
  int virtual_stages = 1;

  // The model stages: p x v.
  int model_stages() const { return stages * virtual_stages; }
};

// All violations, "; "-separated, in one InvalidArgument: p < 1, m < 1, steps < 1,
// first_step outside [0, steps), a flush_before boundary outside (first_step, steps), and for
// kTwoBW m < p ("2bw needs micro_batches >= stages: got m=2 < p=4"), virtual_stages other
// than 1 for a kind without chunks, and the rules of the chunked kinds
// (chunked_schedule.h ValidateChunkedParams).
absl::Status ValidateScheduleParams(const ScheduleParams& params);

// The action list of stage `stage` (0 <= stage < p; with chunks, of rank `stage`).
absl::StatusOr<std::vector<Action>> BuildStageSchedule(const ScheduleParams& params, int stage);
// All stages' lists, index = stage (with chunks: rank).
absl::StatusOr<std::vector<std::vector<Action>>> BuildSchedule(const ScheduleParams& params);

// The same list as BuildStageSchedule(params, stage), generated as it is consumed: its memory
// does not depend on `steps`, so a stage can run any number of steps. The executor runs
// from one; BuildStageSchedule is the plain reference it is tested against.
class StageActionStream {
 public:
  static absl::StatusOr<StageActionStream> Create(const ScheduleParams& params, int stage);

  bool done() const { return size_ == 0; }
  const Action& current() const { return buffer_[next_]; }  // REQUIRES: !done()
  void Advance();
  // Actions before current() (its index in BuildStageSchedule's list).
  int64_t position() const { return position_; }
  const ScheduleParams& params() const { return params_; }

  // The list under `changed` (the same kind, p, m, first_step and stage; more flush_before
  // boundaries or fewer steps, none at or before the start of the drained stretch the stream is
  // in), positioned at the same action. FailedPrecondition if the two lists differ anywhere up to
  // and including current(): the change came too late for what already ran. Costs the
  // actions since the stretch began (the last drained boundary).
  absl::StatusOr<StageActionStream> Rebase(const ScheduleParams& changed) const;

 private:
  StageActionStream(const ScheduleParams& params, int stage);
  // Starts the drained stretch (segment) that begins at mini-batch `begin`, at `position`.
  void StartSegment(int64_t begin, int64_t position);
  // End (exclusive, in mini-batches) of the segment that begins at `begin`.
  int64_t SegmentEnd(int64_t begin) const;
  // Fills buffer_ with the next forward or backward of the segment (with its communication
  // and STEP), moving on to the next segment at the end of one; size_ = 0 after the last.
  void Fill();
  // The segment's operations: its forwards and backwards (with their messages) under 2bw
  // and pipedream, else the actions of one step's list and its STEP.
  int64_t SegmentOps() const;

  ScheduleParams params_;
  int stage_ = 0;
  // Under a kind that flushes: this rank's list for one step (micro-batches 0 .. m−1,
  // messages included), shared by the copies of the stream.
  std::shared_ptr<const std::vector<Action>> step_list_;
  int64_t segment_begin_ = 0;          // first mini-batch of the segment
  int64_t segment_micro_batches_ = 0;  // c: micro-batches in the segment
  int64_t segment_position_ = 0;       // position of the segment's first action
  int64_t op_ = 0;                     // next forward/backward of the segment, 0 .. 2c-1
  std::array<Action, 4> buffer_{};     // actions of the forward or backward being emitted
  int size_ = 0, next_ = 0;
  int64_t position_ = 0;
};

// PipeDream-2BW: the weight version used by every F and B of global micro-batch j,
// max(floor(j/m) - 1, 0).
inline int64_t TwoBWVersionForMicroBatch(int64_t j, int m) {
  const int64_t v = j / m - 1;
  return v < 0 ? 0 : v;
}

}  // namespace pipetrain::schedule
