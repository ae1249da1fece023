#include "runtime/schedule/schedule.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/base/errors.h"
#include "runtime/base/status_macros.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/schedule/communication.h"

namespace pipetrain::schedule {
namespace {

struct KindAlias {
  absl::string_view name;  // Debian's Abseil: absl::string_view is not std::string_view
  ScheduleKind kind;
};

constexpr KindAlias kKindAliases[] = {
    {"gpipe", ScheduleKind::kGPipe},
    {"1f1b", ScheduleKind::kOneFOneB},
    {"2bw", ScheduleKind::kTwoBW},
    {"flush", ScheduleKind::kOneFOneB},
    {"pipedream-flush", ScheduleKind::kOneFOneB},
    {"pipedream-2bw", ScheduleKind::kTwoBW},
    {"pipedream", ScheduleKind::kPipeDream},
    {"weight-stashing", ScheduleKind::kPipeDream},
    {"last-stage", ScheduleKind::kOneFOneB},  // Hippie's name for the same schedule
    {"interleaved", ScheduleKind::kInterleaved},
    {"interleaved-1f1b", ScheduleKind::kInterleaved},
    {"zb1p", ScheduleKind::kZeroBubble},
    {"zbh1", ScheduleKind::kZeroBubble},
    {"zero-bubble", ScheduleKind::kZeroBubble},
    {"zbv", ScheduleKind::kZeroBubbleV},
    {"zb-v", ScheduleKind::kZeroBubbleV},
    {"dualpipev", ScheduleKind::kDualPipeV},
};

using Placement = ChunkPlacement;
using Weights = WeightPolicy;

// kind, name, chunks, splits B, continuous, default v, placement, weights, m per rank, auto
constexpr ScheduleTraits kTraits[] = {
    {ScheduleKind::kGPipe, "gpipe", false, false, false, 1, Placement::kLoop, Weights::kFlush, 0,
     true},
    {ScheduleKind::kOneFOneB, "1f1b", false, false, false, 1, Placement::kLoop, Weights::kFlush, 0,
     true},
    {ScheduleKind::kTwoBW, "2bw", false, false, true, 1, Placement::kLoop, Weights::kDoubleBuffered,
     1, true},
    {ScheduleKind::kPipeDream, "pipedream", false, false, true, 1, Placement::kLoop,
     Weights::kStashed, 0, false},
    {ScheduleKind::kInterleaved, "interleaved", true, false, false, 2, Placement::kLoop,
     Weights::kFlush, 0, false},
    {ScheduleKind::kZeroBubble, "zb1p", true, true, false, 1, Placement::kLoop, Weights::kFlush, 0,
     false},
    {ScheduleKind::kZeroBubbleV, "zbv", true, true, false, 2, Placement::kV, Weights::kFlush, 0,
     false},
    {ScheduleKind::kDualPipeV, "dualpipev", true, true, false, 2, Placement::kV, Weights::kFlush, 2,
     false},
};
static_assert(std::size(kTraits) == std::size(kScheduleKinds));

const ScheduleTraits* FindTraits(ScheduleKind kind) {
  for (const ScheduleTraits& t : kTraits) {
    if (t.kind == kind) return &t;
  }
  return nullptr;
}

bool IsKnownKind(ScheduleKind kind) { return FindTraits(kind) != nullptr; }

// Every rank's list for one step of a schedule that flushes (index = rank): its compute
// list (chunked_schedule.h) with its messages (communication.h); without chunks the actions
// name no stage (the list is its rank's one stage's).
absl::StatusOr<std::vector<std::vector<Action>>> OneStepLists(const ScheduleParams& params) {
  PT_ASSIGN_OR_RETURN(std::vector<std::vector<Action>> compute, BuildComputeLists(params));
  PT_ASSIGN_OR_RETURN(std::vector<std::vector<Action>> lists,
                      AddCommunication(LayoutOf(params), params.micro_batches, compute));
  if (!HoldsChunks(params.kind)) {
    for (std::vector<Action>& list : lists) {
      for (Action& a : list) a.stage = kOwnStage;
    }
  }
  return lists;
}

// `action` of step t's list: its micro-batch numbered from t·m.
Action InStep(Action action, int64_t t, int m) {
  action.index += t * m;
  return action;
}

// `step` (a rank's one-step list) for steps first_step .. steps − 1, each followed by its
// STEP: the rank's whole list under a schedule that flushes.
std::vector<Action> EveryStep(const ScheduleParams& params, const std::vector<Action>& step) {
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(params.steps - params.first_step) * (step.size() + 1));
  for (int64_t t = params.first_step; t < params.steps; ++t) {
    for (const Action& a : step) out.push_back(InStep(a, t, params.micro_batches));
    out.push_back(Step(t));
  }
  return out;
}

// Appends F<j> with the communication placed around it (see schedule.h): 2bw's and
// pipedream's continuous 1F1B.
void AppendForward(int p, int s, int64_t j, std::vector<Action>* out) {
  if (s > 0) out->push_back(RecvAct(j));
  out->push_back(F(j));
  if (s < p - 1) out->push_back(SendAct(j));
}

// Appends B<j> with its communication, then STEP<t> if j is the last micro-batch of
// mini-batch t. STEP comes after SEND_GRAD<j>, so that the upstream stage is not held up by
// the weight update.
void AppendBackward(int p, int s, int m, int64_t j, std::vector<Action>* out) {
  if (s < p - 1) out->push_back(RecvGrad(j));
  out->push_back(B(j));
  if (s > 0) out->push_back(SendGrad(j));
  if ((j + 1) % m == 0) out->push_back(Step(j / m));
}

// 1F1B over micro-batches first .. first+count-1: warm-up forwards, (F, B) pairs, then the
// remaining backwards.
void AppendOneFOneB(int p, int s, int m, int64_t first, int64_t count, std::vector<Action>* out) {
  const int64_t warmup = std::min<int64_t>(p - s - 1, count);
  for (int64_t i = 0; i < warmup; ++i) AppendForward(p, s, first + i, out);
  for (int64_t i = 0; i < count - warmup; ++i) {
    AppendForward(p, s, first + warmup + i, out);
    AppendBackward(p, s, m, first + i, out);
  }
  for (int64_t i = count - warmup; i < count; ++i) AppendBackward(p, s, m, first + i, out);
}

}  // namespace

const ScheduleTraits& TraitsOf(ScheduleKind kind) {
  const ScheduleTraits* traits = FindTraits(kind);
  return traits != nullptr ? *traits : kTraits[static_cast<size_t>(ScheduleKind::kOneFOneB)];
}

std::string_view ScheduleKindName(ScheduleKind kind) {
  const ScheduleTraits* traits = FindTraits(kind);
  return traits != nullptr ? traits->name : "unknown";
}

bool RunsContinuously(ScheduleKind kind) { return TraitsOf(kind).runs_continuously; }
bool HoldsChunks(ScheduleKind kind) { return TraitsOf(kind).holds_chunks; }
bool SplitsBackward(ScheduleKind kind) { return TraitsOf(kind).splits_backward; }
int DefaultVirtualStages(ScheduleKind kind) { return TraitsOf(kind).default_virtual_stages; }
WeightPolicy WeightsOf(ScheduleKind kind) { return TraitsOf(kind).weights; }

absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view name) {
  const std::string original(name);
  std::string lower = original;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::vector<absl::string_view> accepted;
  for (const KindAlias& alias : kKindAliases) {
    if (alias.name == lower) return alias.kind;
    accepted.push_back(alias.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown schedule kind '", original,
                                                 "'; accepted: ", absl::StrJoin(accepted, ", ")));
}

absl::Status ValidateScheduleParams(const ScheduleParams& params) {
  std::vector<std::string> errors;
  if (!IsKnownKind(params.kind)) {
    errors.push_back(absl::StrCat("unknown schedule kind ", static_cast<int>(params.kind)));
  }
  if (params.stages < 1) {
    errors.push_back(absl::StrCat("stages must be >= 1: got p=", params.stages));
  }
  if (params.micro_batches < 1) {
    errors.push_back(absl::StrCat("micro_batches must be >= 1: got m=", params.micro_batches));
  }
  if (params.steps < 1) {
    errors.push_back(absl::StrCat("steps must be >= 1: got steps=", params.steps));
  }
  if (params.first_step < 0 || (params.steps >= 1 && params.first_step >= params.steps)) {
    errors.push_back(absl::StrCat("first_step must be in [0, steps=", params.steps, "): got ",
                                  params.first_step));
  }
  for (int64_t n : params.flush_before) {
    if (n <= params.first_step || n >= params.steps) {
      errors.push_back(absl::StrCat("flush_before ", n, " is not a boundary: ", params.first_step,
                                    " < N < steps=", params.steps));
    }
  }
  if (const int k = TraitsOf(params.kind).micro_batches_per_rank;
      !HoldsChunks(params.kind) && k > 0 && params.micro_batches < k * params.stages) {
    // (the kinds with chunks say it with their other rules, ValidateChunkedParams)
    errors.push_back(absl::StrCat(
        std::string(ScheduleKindName(params.kind)),
        " needs micro_batches >= ", k == 1 ? std::string("stages") : absl::StrCat(k, " x stages"),
        ": got m=", params.micro_batches, " < p=", params.stages));
  }
  if (HoldsChunks(params.kind)) {
    if (absl::Status s = ValidateChunkedParams(params); !s.ok()) {
      errors.push_back(std::string(s.message()));
    }
  } else if (IsKnownKind(params.kind) && params.virtual_stages != 1) {
    errors.push_back(absl::StrCat(std::string(ScheduleKindName(params.kind)),
                                  " holds one stage a rank: virtual_stages must be 1, got ",
                                  params.virtual_stages));
  }
  if (errors.empty()) return absl::OkStatus();
  return InvalidArgumentList("", errors);
}

absl::StatusOr<std::vector<Action>> BuildStageSchedule(const ScheduleParams& params, int stage) {
  PT_RETURN_IF_ERROR(ValidateScheduleParams(params));
  const int p = params.stages;
  const int m = params.micro_batches;
  if (stage < 0 || stage >= p) {
    return absl::InvalidArgumentError(absl::StrCat("stage ", stage, " out of range [0, ", p, ")"));
  }
  if (!RunsContinuously(params.kind)) {
    PT_ASSIGN_OR_RETURN(const std::vector<std::vector<Action>> step, OneStepLists(params));
    return EveryStep(params, step[stage]);
  }
  // 2bw and pipedream: one 1F1B from one drained boundary to the next. Each micro-batch costs
  // at most 6 actions (RECV, F, SEND twice), plus one STEP per step.
  std::vector<Action> out;
  out.reserve(static_cast<size_t>(params.steps - params.first_step) *
              (6 * static_cast<size_t>(m) + 1));
  std::vector<int64_t> cuts = params.flush_before;
  cuts.push_back(params.steps);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  int64_t begin = params.first_step;
  for (int64_t end : cuts) {
    AppendOneFOneB(p, stage, m, begin * m, (end - begin) * m, &out);
    begin = end;
  }
  return out;
}

StageActionStream::StageActionStream(const ScheduleParams& params, int stage)
    : params_(params), stage_(stage) {
  std::sort(params_.flush_before.begin(), params_.flush_before.end());
  params_.flush_before.erase(std::unique(params_.flush_before.begin(), params_.flush_before.end()),
                             params_.flush_before.end());
}

absl::StatusOr<StageActionStream> StageActionStream::Create(const ScheduleParams& params,
                                                            int stage) {
  PT_RETURN_IF_ERROR(ValidateScheduleParams(params));
  if (stage < 0 || stage >= params.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " out of range [0, ", params.stages, ")"));
  }
  StageActionStream stream(params, stage);
  if (!RunsContinuously(params.kind)) {
    PT_ASSIGN_OR_RETURN(std::vector<std::vector<Action>> step, OneStepLists(params));
    stream.step_list_ = std::make_shared<const std::vector<Action>>(std::move(step[stage]));
  }
  stream.StartSegment(params.first_step, 0);
  return stream;
}

int64_t StageActionStream::SegmentEnd(int64_t begin) const {
  // The flushing kinds drain after every step; 2bw and pipedream only at flush_before
  // boundaries.
  if (!RunsContinuously(params_.kind)) return begin + 1;
  auto cut = std::upper_bound(params_.flush_before.begin(), params_.flush_before.end(), begin);
  return cut == params_.flush_before.end() ? params_.steps : std::min<int64_t>(*cut, params_.steps);
}

void StageActionStream::StartSegment(int64_t begin, int64_t position) {
  segment_begin_ = begin;
  segment_position_ = position;
  position_ = position;
  segment_micro_batches_ =
      begin < params_.steps ? (SegmentEnd(begin) - begin) * params_.micro_batches : 0;
  op_ = 0;
  Fill();
}

int64_t StageActionStream::SegmentOps() const {
  if (segment_micro_batches_ == 0) return 0;
  if (step_list_) return static_cast<int64_t>(step_list_->size()) + 1;
  return 2 * segment_micro_batches_;
}

void StageActionStream::Fill() {
  size_ = next_ = 0;
  if (op_ == SegmentOps()) {
    if (segment_micro_batches_ == 0) return;  // past the last step: done
    StartSegment(SegmentEnd(segment_begin_), position_);
    return;
  }
  const int p = params_.stages, s = stage_, m = params_.micro_batches;
  const int64_t c = segment_micro_batches_, first = segment_begin_ * m, k = op_++;
  if (step_list_) {  // one step a segment: its list, then its STEP
    buffer_[size_++] = k < static_cast<int64_t>(step_list_->size())
                           ? InStep((*step_list_)[k], segment_begin_, m)
                           : Step(segment_begin_);
    return;
  }
  // The k-th forward/backward of the segment's continuous 1F1B, in the order AppendOneFOneB
  // produces them.
  bool forward;
  int64_t j;
  const int64_t warmup = std::min<int64_t>(p - s - 1, c);
  if (k < warmup) {
    forward = true, j = first + k;
  } else if (k < warmup + 2 * (c - warmup)) {
    const int64_t pair = (k - warmup) / 2;
    forward = (k - warmup) % 2 == 0;
    j = forward ? first + warmup + pair : first + pair;
  } else {
    forward = false, j = first + (c - warmup) + (k - warmup - 2 * (c - warmup));
  }
  auto push = [this](Action a) { buffer_[size_++] = a; };
  if (forward) {
    if (s > 0) push(RecvAct(j));
    push(F(j));
    if (s < p - 1) push(SendAct(j));
  } else {
    if (s < p - 1) push(RecvGrad(j));
    push(B(j));
    if (s > 0) push(SendGrad(j));
    if ((j + 1) % m == 0) push(Step(j / m));
  }
}

void StageActionStream::Advance() {
  if (done()) return;
  ++position_;
  if (++next_ == size_) Fill();
}

absl::StatusOr<StageActionStream> StageActionStream::Rebase(const ScheduleParams& changed) const {
  if (changed.kind != params_.kind || changed.stages != params_.stages ||
      changed.micro_batches != params_.micro_batches || changed.first_step != params_.first_step ||
      changed.virtual_stages != params_.virtual_stages) {
    return absl::InvalidArgumentError("Rebase changes only the boundaries and the steps");
  }
  PT_RETURN_IF_ERROR(ValidateScheduleParams(changed));
  if (RunsContinuously(params_.kind)) {
    // The segment's start must stay a boundary and nothing may change before it.
    for (int64_t n : params_.flush_before) {
      if (n < changed.steps &&
          !std::count(changed.flush_before.begin(), changed.flush_before.end(), n)) {
        return absl::InvalidArgumentError(absl::StrCat("Rebase drops the drain before step ", n));
      }
    }
    for (int64_t n : changed.flush_before) {
      if (n <= segment_begin_ &&
          !std::binary_search(params_.flush_before.begin(), params_.flush_before.end(), n)) {
        return absl::FailedPreconditionError(
            absl::StrCat("a drain before step ", n, " is in the past of this stage (at ",
                         done() ? std::string("its end") : ToString(current()), ")"));
      }
    }
  }
  // Both lists agree up to the segment's start; compare from there through current().
  StageActionStream before(params_, stage_), after(changed, stage_);
  before.step_list_ = after.step_list_ = step_list_;
  before.StartSegment(segment_begin_, segment_position_);
  after.StartSegment(segment_begin_, segment_position_);
  while (true) {
    const bool compare = after.position_ < position_ || !done();
    if (compare && (after.done() || after.current() != before.current())) {
      return absl::FailedPreconditionError(absl::StrCat("it changes action ", after.position_, " (",
                                                        ToString(before.current()),
                                                        "), which this stage already ran"));
    }
    if (after.position_ == position_) return after;
    after.Advance();
    before.Advance();
  }
}

absl::StatusOr<std::vector<std::vector<Action>>> BuildSchedule(const ScheduleParams& params) {
  PT_RETURN_IF_ERROR(ValidateScheduleParams(params));
  std::vector<std::vector<Action>> stages;
  if (!RunsContinuously(params.kind)) {  // one lowering for every rank
    PT_ASSIGN_OR_RETURN(const std::vector<std::vector<Action>> step, OneStepLists(params));
    for (const std::vector<Action>& list : step) stages.push_back(EveryStep(params, list));
    return stages;
  }
  stages.reserve(params.stages);
  for (int s = 0; s < params.stages; ++s) {
    PT_ASSIGN_OR_RETURN(std::vector<Action> actions, BuildStageSchedule(params, s));
    stages.push_back(std::move(actions));
  }
  return stages;
}

}  // namespace pipetrain::schedule
