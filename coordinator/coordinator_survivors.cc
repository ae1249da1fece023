// The survivors of a fault: with the step commit (StageAssignment.commit_steps), the ranks
// whose runs stopped after a rank failed or was lost report where their weights stand; the
// generation's round (survivor_round.h) decides the newest step every place of the pipeline
// has a survivor at; the survivors told to write their state do so as the checkpoint before
// that step through the job's store (the committing one says so in its StageEnd); and that
// checkpoint becomes the job's restart point, every step before it committed. Any other
// outcome (a place no replica of survived, a write that failed, the round given up) leaves
// the restart point where it was: the job restarts from its last checkpoint, as it would
// without the commit. See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/report_checks.h"
#include "rpc/security.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/job_config.h"

namespace pipetrain::coordinator {
namespace {

// The round decides once this many heartbeat intervals passed since the generation ended,
// whatever has not reported by then (a hung rank) passed over.
constexpr int kRoundIntervals = 3;

// The longest a survivor holds its state for the next generation when no heartbeat answer
// lets it go first (the coordinator out of reach).
constexpr absl::Duration kLongestHold = absl::Minutes(10);

// The most layers a survivor may say it holds.
constexpr int kMaxReportedLayers = 1 << 16;

}  // namespace

SurvivorRound* Coordinator::SurvivorsOf(JobEntry& e) {
  if (!e.commit_steps) return nullptr;
  if (!e.survivors) {
    e.survivors.emplace(static_cast<int>(e.rank_worker.size()), e.job.stages());
    // Ranks that ended before the round began (lost, or failed before they could report)
    // will not report.
    for (size_t r = 0; r < e.run.rank_ended.size(); ++r) {
      if (e.run.rank_ended[r]) e.survivors->Gone(static_cast<int>(r));
    }
  }
  return &*e.survivors;
}

void Coordinator::SurvivorGone(JobEntry& e, int rank) {
  SurvivorRound* round = SurvivorsOf(e);
  if (round == nullptr || round->decided()) return;
  round->Gone(rank);
  MaybeDecideSurvivors(e);
}

void Coordinator::MaybeDecideSurvivors(JobEntry& e) {
  if (!e.survivors || e.survivors->decided() || e.run.phase != Phase::kRecovering) return;
  const bool late =
      deps_.clock->Now() >= e.recovering_since + kRoundIntervals * options_.heartbeat_interval;
  if (!e.survivors->AllAccounted() && !late) return;
  e.survivors->Decide();
  const std::optional<recovery::SurvivorPlan>& plan = e.survivors->plan();
  if (!plan) {
    rendezvous_.Close(e.job.id());
    jobs_.Event(e.job.id(), absl::StrCat("the survivors cannot go on (", e.survivors->why_not(),
                                         "): restarting from the last checkpoint"));
    return;
  }
  // The survivors meet in a store of their own: nothing the generation left there (a
  // checkpoint it had begun) counts towards theirs.
  rendezvous_.Open(e.job.id());
  // What they hold in memory for the next generation, and where.
  SurvivorHold held =
      SurvivorHold::FromRound(*e.survivors, e.rank_worker, e.job.stages(), rpc::RandomKey());
  e.held_state = std::move(held);
  holding_jobs_.insert(e.job.id());
  // An intention until their state is committed (SurvivorStageEnd); RunGeneration says so
  // if the next generation starts elsewhere.
  jobs_.Event(e.job.id(),
              absl::StrCat("the survivors' plan: go on from step ", plan->step, " once ",
                           plan->sources.size(), " of them wrote their stage's state (",
                           plan->apply_held.size(), " apply their held update first)",
                           late && !e.survivors->AllAccounted()
                               ? ", without the ranks that did not report in time"
                               : ""));
}

absl::StatusOr<v1::SurvivorInstruction> Coordinator::ReportStopped(const std::string& session,
                                                                   const v1::StoppedRank& s) {
  return LockedThenFlush(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<v1::SurvivorInstruction> {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, s.worker_id()));
    v1::SurvivorInstruction abandon;
    abandon.set_action(v1::SurvivorInstruction::ABANDON);
    auto it = jobs_.find(s.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", s.job_id()));
    JobEntry& e = it->second;
    const std::string where = absl::StrCat("job ", s.job_id(), " rank ", s.rank());
    if (s.rank() < 0 || s.rank() >= static_cast<int>(e.rank_worker.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no such rank"));
    }
    if (s.generation() != e.job.generation() || !IsRunning(e.run.phase)) {
      abandon.set_reason(absl::StrCat("generation ", s.generation(), " of ", s.job_id(),
                                      " no longer runs"));
      return abandon;
    }
    if (e.rank_worker[s.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(
          absl::StrCat(where, " runs on ", e.rank_worker[s.rank()], ", not ", caller->info.id()));
    }
    SurvivorRound* round = SurvivorsOf(e);
    if (round == nullptr) {
      abandon.set_reason(absl::StrCat(s.job_id(), " does not commit its steps"));
      return abandon;
    }
    if (s.next_step() < 0 || s.held_step() < -1 ||
        (s.held_step() >= 0 && s.held_step() != s.next_step())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": next step ", s.next_step(),
                                                     ", held step ", s.held_step()));
    }
    if (s.layers_size() > kMaxReportedLayers ||
        std::any_of(s.layers().begin(), s.layers().end(), [](int l) { return l < 0; })) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", s.layers_size(), " layers, or a negative one"));
    }
    if (!round->reported(s.rank()) && !round->decided()) {
      recovery::CommitState state;
      state.next_step = s.next_step();
      state.held_step = s.held_step();
      if (s.has_held_loss()) state.held_loss = s.held_loss();
      round->Report(s.rank(), state, {s.layers().begin(), s.layers().end()});
      // For the job machine the rank has ended (failed); its worker stays busy until its
      // StageEnd.
      if (e.run.phase != Phase::kRecovering) {
        StageEnded ended;
        ended.rank = s.rank();
        ended.ok = false;
        ended.failed_after_peer = s.failed_after_peer();
        ended.failure = absl::StrCat(RankName(e.job, s.rank()), " on ", s.worker_id(),
                                     " failed: ", s.error().substr(0, kMaxErrorBytes));
        ended.at = deps_.clock->Now();
        ApplyEvent(e, ended);
        // The generation is over: the ranks still running are stopped now, so that they
        // report too (one waiting on this rank would otherwise wait until the job machine
        // decides, as this rank keeps its connections open while it waits for the plan).
        if (round->reports() == 1 && IsRunning(e.run.phase) &&
            e.run.phase != Phase::kRecovering) {
          std::vector<int> running;
          for (size_t r = 0; r < e.run.rank_ended.size(); ++r) {
            if (!e.run.rank_ended[r]) running.push_back(static_cast<int>(r));
          }
          SendStops(e, running,
                    absl::StrCat(RankName(e.job, s.rank()), " stopped (", s.error().substr(0, 200),
                                 "): the survivors report where they stand"));
        }
      }
    }
    MaybeDecideSurvivors(e);
    v1::SurvivorInstruction answer = e.survivors->InstructionFor(s.rank());
    if (answer.hold_state() && e.held_state && e.held_state->step == answer.step()) {
      answer.set_state_key(e.held_state->key);
      answer.set_hold_ms(absl::ToInt64Milliseconds(kLongestHold));
    } else {
      answer.set_hold_state(false);
    }
    if (answer.action() == v1::SurvivorInstruction::WAIT) {
      // Decided within three intervals of the generation's end, which is at most two
      // intervals away (a lost worker's) or, for a held failure, one and a half.
      const absl::Time by = (e.run.phase == Phase::kRecovering
                                 ? e.recovering_since
                                 : deps_.clock->Now() + 2 * options_.heartbeat_interval) +
                            kRoundIntervals * options_.heartbeat_interval;
      answer.set_wait_ms(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(by - deps_.clock->Now())) +
          absl::ToInt64Milliseconds(options_.heartbeat_interval));
    }
    return answer;
  });
}

void Coordinator::SurvivorStageEnd(JobEntry& e, const v1::StageEnd& end) {
  SurvivorRound& round = *e.survivors;
  if (!round.reported(end.rank())) {
    SurvivorGone(e, end.rank());
    return;
  }
  const std::optional<recovery::SurvivorPlan>& plan = round.plan();
  if (!plan || e.run.phase != Phase::kRecovering) return;
  if (!end.survivor_failed().empty()) {
    jobs_.Event(e.job.id(), absl::StrCat("the survivors' state before step ", plan->step,
                                         " was not written: ", RankName(e.job, end.rank()),
                                         ": ", end.survivor_failed().substr(0, kMaxErrorBytes),
                                         " (the job restarts from its last checkpoint)"));
    return;
  }
  if (end.survivor_checkpoint().empty() || end.survivor_step() != plan->step) return;
  // Every step before it is done: the survivors finished it or applied its update.
  CommitSteps(e, e.ledger.CommitThrough(plan->step - 1, round.held_loss()));
  e.job.set_step(plan->step - 1);
  e.job.set_checkpoint_step(plan->step);
  e.job.set_checkpoint_path(end.survivor_checkpoint().substr(0, 4096));
  if (e.job.recoveries_size() > 0) {
    v1::Recovery* rec = e.job.mutable_recoveries(e.job.recoveries_size() - 1);
    rec->set_resumed_at_step(plan->step);
    rec->set_from_survivors(true);
  }
  // The next generation need not wait for a lost worker's lease: a rank it may still run
  // (cut off from here) has no peer left to go on with (every other rank of its generation
  // has stopped), any layer file it could still write holds the bytes its surviving replicas
  // hold for that step (replicas are bitwise equal), and its calls on the job's store are
  // refused once the next generation runs.
  e.lost_ranks_stop_by = absl::InfinitePast();
  jobs_.Event(e.job.id(), absl::StrCat("the survivors' state before step ", plan->step,
                                       " committed: ", e.job.checkpoint_path(),
                                       ": the survivors go on from step ", plan->step,
                                       " (no step to run again)"));
  jobs_.Changed(e);
}

v1::ReplicaState Coordinator::ReplicaStateFor(JobEntry& e, int64_t start_step) {
  if (!e.held_state) return v1::ReplicaState();
  SurvivorHold::ForGeneration taken =
      e.held_state->StateFor(start_step, [this](const std::string& id) {
        mu_.AssertHeld();
        const WorkerPool::Worker* w = pool_.Find(id);
        return w != nullptr && w->info.state() != v1::WORKER_STATE_LOST ? w->info.address()
                                                                          : std::string();
      });
  if (taken.missing_layer) {
    jobs_.Event(e.job.id(), absl::StrCat("no worker holding layer ", *taken.missing_layer,
                                         " of the survivors' state is left: the next "
                                         "generation reads the checkpoint before step ",
                                         start_step));
  }
  return std::move(taken.state);
}

std::vector<std::string> Coordinator::HeldStateJobsOf(const std::string& worker_id) {
  std::vector<std::string> out;
  for (auto it = holding_jobs_.begin(); it != holding_jobs_.end();) {
    auto j = jobs_.find(*it);
    // Needed until the job has committed the step again (the next generation then holds it)
    // or has ended.
    if (j == jobs_.end() || !j->second.held_state || IsFinal(j->second.run.phase) ||
        !j->second.held_state->NeededAfter(j->second.job.step())) {
      if (j != jobs_.end()) j->second.held_state.reset();
      it = holding_jobs_.erase(it);
      continue;
    }
    if (j->second.held_state->HeldBy(worker_id)) out.push_back(*it);
    ++it;
  }
  return out;
}

void Coordinator::RecordLateStep(JobEntry& e, const v1::StepReport& r) {
  if (e.ledger.Expects(e.ledger.last_step(r.rank()), r.step()) != StepLedger::Order::kNext ||
      r.step() < 0 || r.step() >= e.job.steps() ||
      !CheckStepReportFields(r, e.job.stages(), "a late report").ok()) {
    return;
  }
  // Rows of steps every rank finished after all (a row of a step run again is replaced).
  CommitSteps(e, e.ledger.Record(r).committed);
}

}  // namespace pipetrain::coordinator
