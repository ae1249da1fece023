#include "coordinator/job_machine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

bool InRange(const JobRun& run, int rank) {
  return rank >= 0 && rank < static_cast<int>(run.rank_ended.size());
}

std::vector<int> NotEnded(const JobRun& run) {
  std::vector<int> ranks;
  for (size_t r = 0; r < run.rank_ended.size(); ++r) {
    if (!run.rank_ended[r]) ranks.push_back(static_cast<int>(r));
  }
  return ranks;
}

// Stops the ranks not ended, if any.
void StopRest(Transition& t, std::string reason) {
  std::vector<int> ranks = NotEnded(t.run);
  if (!ranks.empty()) t.commands.push_back(StopRanks{std::move(reason), std::move(ranks)});
}

void ClearHeld(JobRun& run) {
  run.held_failure.clear();
  run.held_after_peer = false;
}

// The job ends in `final`; ranks still running (not when recovering or queued) are stopped.
void End(Transition& t, Phase final, std::string message) {
  const bool ranks_run = t.run.phase == Phase::kRunning || t.run.phase == Phase::kHeldFailure;
  t.run.phase = final;
  ClearHeld(t.run);
  t.commands.push_back(EndJob{message});
  if (ranks_run) StopRest(t, std::move(message));
}

// A fault (`cause`) ended the generation: the job restarts if it has restarts left, else
// fails with `cause`. `survivors`: BeginRecovery's.
void FailOrRestart(Transition& t, std::string cause, const RestartPolicy& policy,
                   bool survivors = true) {
  const int restarts = t.run.restarts;
  if (restarts >= policy.max_restarts) {
    End(t, Phase::kFailed,
        restarts == 0
            ? std::move(cause)
            : absl::StrCat(cause, " (after ", restarts, " restart", restarts == 1 ? "" : "s",
                           "; max_restarts is ", policy.max_restarts, ")"));
    return;
  }
  StopRest(t, absl::StrCat("generation ", t.run.generation, " ended: ", cause));
  t.run.phase = Phase::kRecovering;
  ClearHeld(t.run);
  t.run.restarts = restarts + 1;
  t.commands.push_back(BeginRecovery{std::move(cause), survivors});
}

struct Visitor {
  Transition& t;
  const RestartPolicy& policy;
  bool running() const {
    return t.run.phase == Phase::kRunning || t.run.phase == Phase::kHeldFailure;
  }

  void operator()(const GenerationStarted& e) {
    if (t.run.phase != Phase::kQueued && t.run.phase != Phase::kRecovering) return;
    t.run.phase = Phase::kRunning;
    ++t.run.generation;
    t.run.rank_ended.assign(std::max(0, e.ranks), false);
    ClearHeld(t.run);
    t.run.stop_step = 0;
  }

  void operator()(const StageEnded& e) {
    if (!running() || !InRange(t.run, e.rank)) return;
    t.run.rank_ended[e.rank] = true;
    t.commands.push_back(MarkStage{e.rank, e.ok ? StageMark::kDone : StageMark::kFailed});
    const bool all_ended = std::all_of(t.run.rank_ended.begin(), t.run.rank_ended.end(),
                                       [](bool ended) { return ended; });
    const bool held = t.run.phase == Phase::kHeldFailure;
    // The real cause wins over one that was only a consequence of another rank's.
    const bool replaces = held && t.run.held_after_peer && !e.failed_after_peer;
    if (!e.ok && (!held || replaces)) {
      if (!held) t.run.held_since = e.at;
      t.run.phase = Phase::kHeldFailure;
      t.run.held_failure = e.failure;
      t.run.held_after_peer = e.failed_after_peer;
      // Said now unless it is decided at once (no rank left whose worker may be the cause).
      if (!all_ended) t.commands.push_back(Announce{e.failure});
    }
    if (!all_ended) return;
    if (t.run.phase == Phase::kRunning) {
      End(t, Phase::kSucceeded,
          t.run.stop_step > 0
              ? absl::StrCat("stopped before step ", t.run.stop_step, " by a stop command")
              : std::string());
    } else {
      FailOrRestart(t, t.run.held_failure, policy);
    }
  }

  void operator()(const RankLost& e) {
    if (!running()) return;
    if (InRange(t.run, e.rank)) {
      t.run.rank_ended[e.rank] = true;
      t.commands.push_back(MarkStage{e.rank, StageMark::kLost});
    }
    FailOrRestart(t, e.cause, policy);
  }

  void operator()(const PeersAlive&) {
    if (t.run.phase == Phase::kHeldFailure) FailOrRestart(t, t.run.held_failure, policy);
  }

  void operator()(const Fault& e) {
    if (!running()) return;
    if (InRange(t.run, e.rank)) t.run.rank_ended[e.rank] = true;
    FailOrRestart(t, e.cause, policy, /*survivors=*/false);
  }

  void operator()(const Unplaceable& e) {
    if (!running()) return;
    if (InRange(t.run, e.rank)) t.run.rank_ended[e.rank] = true;
    StopRest(t, absl::StrCat("requeued: ", e.why));
    t.run.phase = Phase::kQueued;
    t.run.rank_ended.clear();
    ClearHeld(t.run);
    t.commands.push_back(Requeue{e.why});
  }

  void operator()(const StopScheduled& e) {
    if (running()) t.run.stop_step = e.step;
  }

  void operator()(const RecoveryTimedOut& e) {
    if (t.run.phase == Phase::kRecovering) End(t, Phase::kFailed, e.message);
  }

  void operator()(const CancelRequested&) {
    if (!IsFinal(t.run.phase)) End(t, Phase::kCancelled, "cancelled by the user");
  }
};

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kQueued: return "queued";
    case Phase::kRunning: return "running";
    case Phase::kHeldFailure: return "held failure";
    case Phase::kRecovering: return "recovering";
    case Phase::kSucceeded: return "succeeded";
    case Phase::kFailed: return "failed";
    case Phase::kCancelled: return "cancelled";
  }
  return "?";
}

bool IsFinal(Phase phase) {
  return phase == Phase::kSucceeded || phase == Phase::kFailed || phase == Phase::kCancelled;
}

bool IsRunning(Phase phase) {
  return phase == Phase::kRunning || phase == Phase::kHeldFailure || phase == Phase::kRecovering;
}

Transition Apply(JobRun run, const JobEvent& event, const RestartPolicy& policy) {
  Transition t{std::move(run), {}};
  std::visit(Visitor{t, policy}, event);
  return t;
}

}  // namespace pipetrain::coordinator
