#include "runtime/schedule/chunked_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::schedule {
namespace {

// One rank's list under construction: micro-batch counters per stage (forwards, backwards
// (B or I)), the I's still owing their W in first-in-first-out order.
class RankList {
 public:
  void Forward(int stage) { Emit(ActionKind::kForward, stage, next_forward_[stage]++); }
  void FullBackward(int stage) { Emit(ActionKind::kBackward, stage, next_backward_[stage]++); }
  void InputGradient(int stage) {
    const int64_t j = next_backward_[stage]++;
    Emit(ActionKind::kInputGradient, stage, j);
    pending_w_.emplace_back(stage, j);
  }
  // The W of the oldest I without one (of `stage` only, when given); false when none owes.
  bool PopWeightGradient(int stage = -1) {
    auto it = std::find_if(pending_w_.begin(), pending_w_.end(),
                           [stage](const auto& w) { return stage < 0 || w.first == stage; });
    if (it == pending_w_.end()) return false;
    Emit(ActionKind::kWeightGradient, it->first, it->second);
    pending_w_.erase(it);
    return true;
  }
  void FlushWeightGradients(int stage = -1) {
    while (PopWeightGradient(stage)) {
    }
  }
  int64_t forwards_done(int stage) const {
    auto it = next_forward_.find(stage);
    return it == next_forward_.end() ? 0 : it->second;
  }
  // The list without the actions of micro-batches >= m (ZB-V builds for more than m).
  std::vector<Action> Take(int64_t m) && {
    actions_.erase(std::remove_if(actions_.begin(), actions_.end(),
                                  [m](const Action& a) { return a.index >= m; }),
                   actions_.end());
    return std::move(actions_);
  }

 private:
  void Emit(ActionKind kind, int stage, int64_t j) { actions_.push_back({kind, j, stage}); }

  std::vector<Action> actions_;
  std::map<int, int64_t> next_forward_, next_backward_;
  std::deque<std::pair<int, int64_t>> pending_w_;  // (stage, micro-batch)
};

// GPipe on rank r, one stage a rank: every forward, then every backward.
std::vector<Action> GPipeRank(int64_t m, int r) {
  RankList list;
  for (int64_t j = 0; j < m; ++j) list.Forward(r);
  for (int64_t j = 0; j < m; ++j) list.FullBackward(r);
  return std::move(list).Take(m);
}

// 1F1B (PipeDream-Flush) on rank r of p, one stage a rank: min(p − r − 1, m) warm-up
// forwards, then (F, B) pairs, then the remaining backwards.
std::vector<Action> OneFOneBRank(int p, int64_t m, int r) {
  const int64_t warmup = std::min<int64_t>(p - r - 1, m);
  RankList list;
  for (int64_t i = 0; i < warmup; ++i) list.Forward(r);
  for (int64_t i = 0; i < m - warmup; ++i) {
    list.Forward(r);
    list.FullBackward(r);
  }
  for (int64_t i = 0; i < warmup; ++i) list.FullBackward(r);
  return std::move(list).Take(m);
}

// Loop placements group micro-batches in rounds of g = m / rounds, rounds = max(1, m / p)
// (PyTorch's ScheduleInterleaved1F1B; Megatron's group size).
int GroupSize(int p, int m) { return m / std::max(1, m / p); }

// Interleaved 1F1B and interleaved zero-bubble on rank r (a warm-up, then each
// forward op k followed by backward op k − warm-up, then the remaining backwards). Op k's
// forward runs stage (⌊k/g⌋ mod v)·p + r; backward op b runs (v−1−(⌊b/g⌋ mod v))·p + r.
// Zero-bubble: the warm-up is one op per hop, I replaces B, and after backward op b >= r the
// oldest I gets its W; the rest at the end (rank r owes at most r W's).
std::vector<Action> LoopRank(const ScheduleParams& params, int r, bool zero_bubble) {
  const int p = params.stages, v = params.virtual_stages;
  const int64_t m = params.micro_batches, total = v * m;
  const int64_t g = GroupSize(p, static_cast<int>(m));
  const int64_t hops = zero_bubble ? (p - 1 - r) : 2 * (p - 1 - r);
  const int64_t warmup = std::min<int64_t>((v - 1) * g + hops, total);
  const auto forward_stage = [&](int64_t k) { return static_cast<int>((k / g) % v) * p + r; };
  const auto backward_stage = [&](int64_t b) {
    return static_cast<int>(v - 1 - (b / g) % v) * p + r;
  };
  RankList list;
  const auto backward = [&](int64_t b) {
    if (!zero_bubble) {
      list.FullBackward(backward_stage(b));
      return;
    }
    list.InputGradient(backward_stage(b));
    if (b >= r) list.PopWeightGradient();
  };
  for (int64_t k = 0; k < warmup; ++k) list.Forward(forward_stage(k));
  for (int64_t k = warmup; k < total; ++k) {
    list.Forward(forward_stage(k));
    backward(k - warmup);
  }
  for (int64_t b = total - warmup; b < total; ++b) backward(b);
  list.FlushWeightGradients();
  return std::move(list).Take(m);
}

// ZB-V on rank r (chunks c0 = r, c1 = 2p−1−r), built for n = max(2p−1, m) micro-batches and
// cut back to m; each W is its own chunk's oldest owed.
std::vector<Action> ZeroBubbleVRank(int p, int64_t m, int r) {
  const int c0 = r, c1 = 2 * p - 1 - r;
  const int64_t n = std::max<int64_t>(2 * p - 1, m);
  RankList list;
  const auto forward_left = [&](int c) { return list.forwards_done(c) < n; };
  for (int i = 0; i < 2 * (p - r) - 1; ++i) list.Forward(c0);
  for (int i = 0; i < r; ++i) {
    list.Forward(c1);
    list.Forward(c0);
  }
  // I then W of chunk c, its W the oldest that chunk owes.
  const auto input_then_weight = [&](int c) {
    list.InputGradient(c);
    list.PopWeightGradient(c);
  };
  for (int i = 0; i < p - r; ++i) {
    list.Forward(c1);
    input_then_weight(c1);
  }
  while (forward_left(c0) || forward_left(c1)) {
    if (forward_left(c0)) list.Forward(c0);
    input_then_weight(c0);
    list.Forward(c1);
    input_then_weight(c1);
  }
  for (int i = 0; i < r; ++i) {
    list.InputGradient(c0);
    list.InputGradient(c1);
  }
  for (int i = 0; i < p - r; ++i) input_then_weight(c0);
  list.FlushWeightGradients(c1);
  list.FlushWeightGradients(c0);
  return std::move(list).Take(m);
}

// DualPipeV on rank r (s0 = r, s1 = 2p−1−r; DeepSeek's dualpipev.py): one FIFO of owed W's.
// "F with B" pairs are written F then B (their overlap is a GPU's; here they run in turn).
std::vector<Action> DualPipeVRank(int p, int64_t m, int r) {
  const int s0 = r, s1 = 2 * p - 1 - r;
  RankList list;
  for (int i = 0; i < 2 * (p - r - 1); ++i) list.Forward(s0);
  for (int i = 0; i < r + 1; ++i) {
    list.Forward(s0);
    list.Forward(s1);
  }
  for (int i = 0; i < p - r - 1; ++i) {
    list.InputGradient(s1);
    list.PopWeightGradient();
    list.Forward(s1);
  }
  for (int64_t i = 0; i < m - 2 * p + r + 1; ++i) {
    list.Forward(s0);
    list.FullBackward(s1);
    list.Forward(s1);
    list.FullBackward(s0);
  }
  for (int i = 0; i < p - r - 1; ++i) {
    list.FullBackward(s1);
    list.Forward(s1);
    list.FullBackward(s0);
  }
  // The last r + 1 backward pairs split from i = ⌊(r+1)/2⌋ on: before the s1 action for odd
  // r, before the s0 action for even r.
  const int split_from = (r + 1) / 2;
  for (int i = 0; i < r + 1; ++i) {
    const bool split_s1 = i > split_from || (i == split_from && r % 2 == 1);
    const bool split_s0 = i >= split_from;
    split_s1 ? list.InputGradient(s1) : list.FullBackward(s1);
    split_s0 ? list.InputGradient(s0) : list.FullBackward(s0);
  }
  for (int i = 0; i < p - r - 1; ++i) {
    list.PopWeightGradient();
    list.InputGradient(s0);
  }
  for (int i = 0; i < r + 1; ++i) list.PopWeightGradient();
  list.FlushWeightGradients();  // none left where the rules hold (compute_lists.h checks)
  return std::move(list).Take(m);
}

}  // namespace

int ChunkLayout::RankOf(int stage) const {
  if (placement == ChunkPlacement::kV) return stage < ranks ? stage : 2 * ranks - 1 - stage;
  return stage % ranks;
}

std::vector<int> ChunkLayout::StagesOf(int rank) const {
  if (placement == ChunkPlacement::kV) return {rank, 2 * ranks - 1 - rank};
  std::vector<int> stages;
  for (int c = 0; c < chunks_per_rank; ++c) stages.push_back(c * ranks + rank);
  return stages;
}

ChunkLayout LayoutOf(const ScheduleParams& params) {
  ChunkLayout layout;
  layout.ranks = params.stages;
  layout.placement = TraitsOf(params.kind).placement;
  const bool v_shaped = layout.placement == ChunkPlacement::kV;
  layout.chunks_per_rank = v_shaped ? 2 : std::max(1, params.virtual_stages);
  return layout;
}

absl::Status ValidateChunkedParams(const ScheduleParams& params) {
  std::vector<std::string> errors;
  const std::string name(ScheduleKindName(params.kind));
  const int p = params.stages, v = params.virtual_stages, m = params.micro_batches;
  if (v < 1) errors.push_back(absl::StrCat("virtual_stages: must be >= 1, got ", v));
  if (params.kind == ScheduleKind::kInterleaved && v == 1) {
    errors.push_back("interleaved needs virtual_stages >= 2 (with one chunk a rank it is 1f1b)");
  }
  const bool loop = params.kind == ScheduleKind::kInterleaved ||
                    (params.kind == ScheduleKind::kZeroBubble && v >= 2);
  if (loop && p >= 1 && m >= 1 && v >= 2) {
    const int rounds = std::max(1, m / p);
    if (m % rounds != 0) {
      errors.push_back(absl::StrCat(
          name, " with virtual_stages >= 2 runs micro-batches in rounds of max(1, floor(m/p)) = ",
          rounds, ": microbatches (", m, ") must be a multiple of it"));
    }
  }
  if (TraitsOf(params.kind).placement == ChunkPlacement::kV && v != 2) {
    errors.push_back(absl::StrCat(name,
                                  " places 2 chunks on each rank (a V): virtual_stages "
                                  "must be 2, got ",
                                  v));
  }
  if (const int k = TraitsOf(params.kind).micro_batches_per_rank; k > 0 && p >= 1 && m < k * p) {
    errors.push_back(absl::StrCat(name, " needs microbatches >= ", k, " x stages: got m=", m, " < ",
                                  k, " x ", p));
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
}

absl::StatusOr<std::vector<std::vector<Action>>> BuildComputeLists(const ScheduleParams& params) {
  if (absl::Status s = ValidateScheduleParams(params); !s.ok()) return s;
  if (RunsContinuously(params.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(ScheduleKindName(params.kind)),
                     " runs one 1F1B over every step with no flush: it has no one-step lists"));
  }
  std::vector<std::vector<Action>> lists;
  for (int r = 0; r < params.stages; ++r) {
    switch (params.kind) {
      case ScheduleKind::kGPipe: lists.push_back(GPipeRank(params.micro_batches, r)); break;
      case ScheduleKind::kOneFOneB:
        lists.push_back(OneFOneBRank(params.stages, params.micro_batches, r));
        break;
      case ScheduleKind::kInterleaved:
        lists.push_back(LoopRank(params, r, /*zero_bubble=*/false));
        break;
      case ScheduleKind::kZeroBubble:
        lists.push_back(LoopRank(params, r, /*zero_bubble=*/true));
        break;
      case ScheduleKind::kZeroBubbleV:
        lists.push_back(ZeroBubbleVRank(params.stages, params.micro_batches, r));
        break;
      case ScheduleKind::kDualPipeV:
        lists.push_back(DualPipeVRank(params.stages, params.micro_batches, r));
        break;
      case ScheduleKind::kTwoBW:
      case ScheduleKind::kPipeDream: break;  // refused above
    }
  }
  return lists;
}

}  // namespace pipetrain::schedule
