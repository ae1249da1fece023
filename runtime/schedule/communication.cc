#include "runtime/schedule/communication.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/schedule/action_table.h"
#include "runtime/schedule/compute_lists.h"

namespace pipetrain::schedule {
namespace {

// What a compute action needs from another stage, and what it gives one: the stage on the
// other side (-1: none).
struct Edges {
  int needs_from = -1;  // F: the stage below; a backward: the stage above
  int gives_to = -1;    // F: the stage above; a backward: the stage below
};
Edges EdgesOf(const ChunkLayout& layout, const Action& a) {
  const int s = a.stage, last = layout.stages() - 1;
  Edges e;
  if (a.kind == ActionKind::kForward) {
    if (s > 0) e.needs_from = s - 1;
    if (s < last) e.gives_to = s + 1;
  } else if (IsBackward(a.kind)) {
    if (s < last) e.needs_from = s + 1;
    if (s > 0) e.gives_to = s - 1;
  }
  return e;
}

// The receive through which stage `s` gets what `a` (on s) needs, and the send that gives
// it, for a compute action whose input crosses ranks.
Action ReceiveFor(const Action& a) {
  return {a.kind == ActionKind::kForward ? ActionKind::kRecvActivation : ActionKind::kRecvGradient,
          a.index, a.stage};
}
Action SendOf(const Action& a) {
  return {a.kind == ActionKind::kForward ? ActionKind::kSendActivation : ActionKind::kSendGradient,
          a.index, a.stage};
}
// The receive on the peer's side that matches `send`.
Action PeerReceive(const Action& send) {
  return send.kind == ActionKind::kSendActivation
             ? Action{ActionKind::kRecvActivation, send.index, send.stage + 1}
             : Action{ActionKind::kRecvGradient, send.index, send.stage - 1};
}

// Whether the input of compute action `a` on its own rank is there: computed on the rank, or
// (crossing ranks) received. `done` marks every action run.
bool InputReady(const ChunkLayout& layout, const Action& a, const ActionTable<char>& done) {
  const auto has = [&](ActionKind kind, int stage) { return done.Get(kind, stage, a.index); };
  if (a.kind == ActionKind::kWeightGradient) return has(ActionKind::kInputGradient, a.stage);
  const int from = EdgesOf(layout, a).needs_from;
  if (from < 0) return true;
  if (layout.RankOf(from) != layout.RankOf(a.stage)) return done.Get(ReceiveFor(a));
  if (a.kind == ActionKind::kForward) return has(ActionKind::kForward, from);
  return has(ActionKind::kBackward, from) || has(ActionKind::kInputGradient, from);
}

}  // namespace

absl::StatusOr<std::vector<std::vector<Action>>> AddCommunication(
    const ChunkLayout& layout, int micro_batches, const std::vector<std::vector<Action>>& compute) {
  if (absl::Status s = CheckComputeLists(layout, micro_batches, compute); !s.ok()) return s;
  const int p = layout.ranks;
  std::vector<std::vector<Action>> out(p);
  for (int r = 0; r < p; ++r) {
    for (const Action& a : compute[r]) {
      const Edges e = EdgesOf(layout, a);
      if (e.needs_from >= 0 && layout.RankOf(e.needs_from) != r) out[r].push_back(ReceiveFor(a));
      out[r].push_back(a);
      if (e.gives_to >= 0 && layout.RankOf(e.gives_to) != r) out[r].push_back(SendOf(a));
    }
  }
  // A rank waits only right before an action for what it needs, which its peer sends right
  // after making it: the lists run to the end exactly when the compute lists do.
  if (absl::Status s = CheckCommunication(layout, micro_batches, out); !s.ok()) return s;
  return out;
}

absl::Status CheckCommunication(const ChunkLayout& layout, int micro_batches,
                                const std::vector<std::vector<Action>>& lists) {
  const int p = layout.ranks;
  if (static_cast<int>(lists.size()) != p) {
    return absl::InvalidArgumentError(absl::StrCat(lists.size(), " lists for ", p, " ranks"));
  }
  // The compute lists within them first: from here on every compute action fits the tables.
  std::vector<std::vector<Action>> compute(p);
  for (int r = 0; r < p; ++r) {
    for (const Action& a : lists[r]) {
      if (!IsMessage(a.kind)) compute[r].push_back(a);
    }
  }
  if (absl::Status s = CheckComputeLists(layout, micro_batches, compute); !s.ok()) return s;
  // Every action seen so far on its rank (a stage's actions are all on its rank's list) and
  // every message.
  ActionTable<char> seen(layout.stages(), micro_batches, false);
  int64_t messages = 0;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : lists[r]) {
      const auto error = [&](auto&&... why) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", r, ": ", ToString(a), " ", why...));
      };
      if (!IsMessage(a.kind)) {
        seen.Set(a, true);
        continue;
      }
      if (a.stage < 0 || a.stage >= layout.stages() || layout.RankOf(a.stage) != r) {
        return error("names a stage rank ", r, " does not hold");
      }
      if (a.index < 0 || a.index >= micro_batches) {
        return error("is outside micro-batches 0 .. ", micro_batches - 1);
      }
      const bool activation =
          a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kRecvActivation;
      const bool send =
          a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient;
      // The stage on the other side.
      const int peer = activation == send ? a.stage + 1 : a.stage - 1;
      if (peer < 0 || peer >= layout.stages()) return error("has no stage on its other side");
      if (layout.RankOf(peer) == r) return error("crosses no rank (stage ", peer, " is here)");
      if (seen.Get(a)) return error("comes twice");
      seen.Set(a, true);
      ++messages;
      // Sent after what makes it; received before what uses it.
      const bool made =
          seen.Get(activation ? ActionKind::kForward : ActionKind::kBackward, a.stage, a.index) ||
          (!activation && seen.Get(ActionKind::kInputGradient, a.stage, a.index));
      if (send && !made) return error("comes before the action that makes it");
      if (!send && made) return error("comes after the action that uses it");
    }
  }
  // Every message that must cross is there, and matched; nothing else is.
  int64_t pairs = 0;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : compute[r]) {
      const Edges e = EdgesOf(layout, a);
      if (e.gives_to >= 0 && layout.RankOf(e.gives_to) != r) {
        ++pairs;
        const Action send = SendOf(a), receive = PeerReceive(send);
        if (!seen.Get(send)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", r, ": ", ToString(a), " is never sent (no ", ToString(send), ")"));
        }
        if (!seen.Get(receive)) {
          return absl::InvalidArgumentError(absl::StrCat("rank ", layout.RankOf(e.gives_to),
                                                         ": no ", ToString(receive), " for ",
                                                         ToString(send)));
        }
      }
    }
  }
  if (messages != 2 * pairs) {
    return absl::InvalidArgumentError(absl::StrCat(messages, " messages where ", 2 * pairs,
                                                   " (a send and a receive per crossing) belong"));
  }
  // Run them: in order, a RECV after its SEND, a compute action after its input.
  std::vector<size_t> next(p, 0);
  ActionTable<char> done(layout.stages(), micro_batches, false);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < lists[r].size()) {
        const Action& a = lists[r][next[r]];
        bool ready = true;
        if (a.kind == ActionKind::kRecvActivation) {
          ready = done.Get(ActionKind::kSendActivation, a.stage - 1, a.index);
        } else if (a.kind == ActionKind::kRecvGradient) {
          ready = done.Get(ActionKind::kSendGradient, a.stage + 1, a.index);
        } else if (!IsMessage(a.kind)) {
          ready = InputReady(layout, a, done);
        }
        if (!ready) break;
        done.Set(a, true);
        ++next[r];
        moved = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    if (next[r] < lists[r].size()) return DeadlockError(lists, next);
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::schedule
