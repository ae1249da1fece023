// One job's controller: its lifecycle carried out on its record, its generations, step
// reports and commits, stage ends, the survivors of a fault and what they hold, drains and
// step commands. See job_controller.h.
#include "coordinator/job_controller.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/placement.h"
#include "coordinator/report_checks.h"
#include "jobspec/step_commands.h"
#include "rpc/security.h"
#include "runtime/base/rank_layout.h"
#include "runtime/control/step_commands.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::coordinator {
namespace {

// The state a job's record shows for its phase.
v1::JobState JobStateOf(Phase phase) {
  switch (phase) {
    case Phase::kQueued: return v1::JOB_STATE_QUEUED;
    case Phase::kSucceeded: return v1::JOB_STATE_SUCCEEDED;
    case Phase::kFailed: return v1::JOB_STATE_FAILED;
    case Phase::kCancelled: return v1::JOB_STATE_CANCELLED;
    case Phase::kRunning:
    case Phase::kHeldFailure:
    case Phase::kRecovering: return v1::JOB_STATE_RUNNING;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

// A stored job's run, as a coordinator that starts finds it: ranks of a running job are not
// known (their workers register again).
JobRun RunFromRecord(const v1::Job& job) {
  JobRun run;
  switch (job.state()) {
    case v1::JOB_STATE_RUNNING: run.phase = Phase::kRunning; break;
    case v1::JOB_STATE_SUCCEEDED: run.phase = Phase::kSucceeded; break;
    case v1::JOB_STATE_FAILED: run.phase = Phase::kFailed; break;
    case v1::JOB_STATE_CANCELLED: run.phase = Phase::kCancelled; break;
    default: run.phase = Phase::kQueued; break;
  }
  run.generation = job.generation();
  run.restarts = job.restarts();
  return run;
}

// The most layers a survivor may say it holds.
constexpr int kMaxReportedLayers = 1 << 16;

}  // namespace

std::string RankName(const v1::Job& job, int rank) {
  return RankLayout{job.stages(), job.replicas()}.Describe(rank);
}

int SkippedInARowBefore(const std::set<int64_t>& skipped, int64_t step) {
  int n = 0;
  while (skipped.count(step - 1 - n) > 0) ++n;
  return n;
}

JobController::JobController(Settings settings, v1::Job job, job::JobSpec config)
    : settings_(std::move(settings)), job_(std::move(job)), config_(std::move(config)) {
  tokens_per_step_ = TokensPerStep(job_, config_);
  run_ = RunFromRecord(job_);
}

int64_t JobController::TokensPerStep(const v1::Job& job, const job::JobSpec& config) {
  const bool tokens = job.data_unit() != "samples";
  return static_cast<int64_t>(config.replicas()) * config.microbatches() *
         config.microbatch_size() * (tokens ? config.data().seq_len() : 1);
}

JobController JobController::FromRecord(Settings settings, v1::Job job,
                                        const absl::StatusOr<job::JobSpec>& config) {
  JobController c(std::move(settings));
  c.job_ = std::move(job);
  if (config.ok()) {
    c.config_ = *config;
    c.tokens_per_step_ = TokensPerStep(c.job_, c.config_);
  }
  c.run_ = RunFromRecord(c.job_);
  if (c.job_.state() != v1::JOB_STATE_RUNNING) return c;
  if (config.ok() && c.job_.restarts() < c.config_.max_restarts()) {
    // Its workers stop their stages when their next heartbeat is refused and register
    // again; the job waits for them (the coordinator's recovery placement).
    c.Apply(Fault{absl::StrCat("the coordinator restarted (", c.job_.step() + 1, " of ",
                               c.job_.steps(), " steps recorded)")});
    return c;
  }
  // Not a transition of its life but what was found: it ran when the coordinator stopped.
  c.run_.phase = Phase::kFailed;
  c.job_.set_state(v1::JOB_STATE_FAILED);
  // Progress is written at most once a second: the steps recorded, not those run.
  c.job_.set_message(absl::StrCat("interrupted by a coordinator restart (", c.job_.step() + 1,
                                  " of ", c.job_.steps(), " steps recorded); its workers stop ",
                                  "their stages and rejoin the pool"));
  c.job_.set_finished_unix_ms(c.NowMs());
  for (auto& st : *c.job_.mutable_stage_status()) {
    if (st.state() != v1::STAGE_STATE_DONE) st.set_state(v1::STAGE_STATE_INTERRUPTED);
  }
  c.Say(c.job_.message());
  c.Changed();
  return c;
}

JobEffects JobController::TakeEffects() { return std::exchange(effects_, JobEffects()); }

int64_t JobController::NowMs() const { return absl::ToUnixMillis(settings_.clock->Now()); }

void JobController::Say(const std::string& text) { effects_.events.push_back(text); }

void JobController::Changed(bool progress_only) {
  const JobEffects::Write w =
      progress_only ? JobEffects::Write::kProgress : JobEffects::Write::kNow;
  effects_.write = std::max(effects_.write, w);
}

void JobController::Stop(const std::vector<int>& ranks, const std::string& reason) {
  for (int r : ranks) {
    if (r < 0 || r >= static_cast<int>(rank_worker_.size())) continue;
    effects_.stops.push_back({rank_worker_[r], job_.generation(), reason});
  }
}

bool JobController::TakesLateReport(int rank, int64_t generation,
                                    const std::string& worker_id) const {
  return run_.phase == Phase::kRecovering && generation == job_.generation() && survivors_ &&
         !survivors_->decided() && rank >= 0 && rank < static_cast<int>(rank_worker_.size()) &&
         rank_worker_[rank] == worker_id;
}

v1::StageAssignment JobController::AssignmentFor(int rank) const {
  v1::StageAssignment assignment;
  assignment.set_job_id(job_.id());
  *assignment.mutable_spec() = run_spec_;
  assignment.set_rank(rank);
  assignment.set_generation(job_.generation());
  assignment.set_commit_steps(commit_steps_);
  assignment.set_skipped_in_a_row(SkippedInARowBefore(skipped_steps_, ledger_.start_step()));
  if (replica_state_.layers_size() > 0) *assignment.mutable_replica_state() = replica_state_;
  return assignment;
}

// ---- The job machine's commands, on the record.

void JobController::Apply(const JobEvent& event) {
  const JobRun before = run_;
  Transition t = coordinator::Apply(run_, event, RestartPolicy{config_.max_restarts()});
  run_ = std::move(t.run);
  job_.set_state(JobStateOf(run_.phase));
  job_.set_restarts(run_.restarts);
  job_.set_generation(run_.generation);
  for (const JobCommand& command : t.commands) {
    if (const auto* stop = std::get_if<StopRanks>(&command)) {
      Stop(stop->ranks, stop->reason);
    } else if (const auto* mark = std::get_if<MarkStage>(&command)) {
      v1::StageStatus* st = job_.mutable_stage_status(mark->rank);
      if (mark->mark == StageMark::kLost) {
        st->set_state(v1::STAGE_STATE_LOST);
      } else {
        st->set_state(mark->mark == StageMark::kDone ? v1::STAGE_STATE_DONE
                                                     : v1::STAGE_STATE_FAILED);
        st->set_action("");
        st->set_waiting_for("");
      }
    } else if (const auto* say = std::get_if<Announce>(&command)) {
      Say(say->text);
    } else if (const auto* recover = std::get_if<BeginRecovery>(&command)) {
      RecordRecovery(*recover);
    } else if (const auto* end = std::get_if<EndJob>(&command)) {
      RecordEnd(end->message);
    } else if (const auto* requeue = std::get_if<Requeue>(&command)) {
      ReturnToQueue(requeue->why);
    }
  }
  // A change of the job's phase, generation or stop step is written at once; what only
  // marks ranks (a rank of thousands ending) is progress, written at most once a second (a
  // job of 4,096 ranks would otherwise be serialized and written once per rank).
  if (run_.phase != before.phase || run_.stop_step != before.stop_step ||
      run_.generation != before.generation) {
    Changed();
  } else if (!t.commands.empty()) {
    Changed(/*progress_only=*/true);
  }
}

void JobController::RecordEnd(const std::string& message) {
  job_.set_message(message);
  job_.set_finished_unix_ms(NowMs());
  if (run_.phase == Phase::kSucceeded) {
    // The loss is the last finite one: say so when the last steps were skipped.
    const int skipped_last = SkippedInARowBefore(skipped_steps_, job_.steps());
    Say(absl::StrCat(
        absl::StrFormat("succeeded: %d steps, final loss %.4f", job_.steps(), job_.loss()),
        skipped_last > 0
            ? absl::StrCat(" (step ", job_.steps() - skipped_last - 1, "'s: the last ",
                           skipped_last, " skipped, their loss or gradients not finite)")
            : std::string(),
        absl::StrFormat(", %.1f s", (job_.finished_unix_ms() - job_.started_unix_ms()) / 1e3)));
  } else {
    Say(absl::StrCat(run_.phase == Phase::kCancelled ? "cancelled" : "failed", ": ", message));
  }
  effects_.rendezvous = JobEffects::Store::kClose;
  commands_reported_.clear();
}

void JobController::RecordRecovery(const BeginRecovery& recovery) {
  const std::string& cause = recovery.cause;
  recovering_since_ = settings_.clock->Now();
  commands_reported_.clear();
  // The survivors of a failed or lost rank may go on from their newest common step: the
  // generation's store stays for their round. A Fault names its own restart point: its
  // round, begun or not, is over.
  SurvivorRound* survivors = Survivors();
  if (survivors != nullptr && !recovery.survivors) {
    survivors->Abandon(absl::StrCat("the generation ended: ", cause));
    survivors = nullptr;
  }
  if (survivors == nullptr) effects_.rendezvous = JobEffects::Store::kClose;
  for (auto& st : *job_.mutable_stage_status()) {
    if (st.state() != v1::STAGE_STATE_DONE && st.state() != v1::STAGE_STATE_FAILED &&
        st.state() != v1::STAGE_STATE_LOST) {
      st.set_state(v1::STAGE_STATE_STOPPING);
    }
  }
  const int64_t resume_at = job_.checkpoint_step();
  v1::Recovery* rec = job_.add_recoveries();
  rec->set_generation(job_.generation() + 1);
  rec->set_cause(cause.substr(0, kMaxErrorBytes));
  rec->set_failed_after_step(job_.step());
  rec->set_resumed_at_step(resume_at);
  rec->set_detected_unix_ms(NowMs());
  const int64_t again = std::max<int64_t>(0, job_.step() + 1 - resume_at);
  job_.set_message(absl::StrCat("recovering (restart ", job_.restarts(), " of ",
                                config_.max_restarts(), "): ", cause));
  const std::string checkpoint =
      absl::StrCat(resume_at > 0 ? absl::StrCat("the checkpoint before step ", resume_at)
                                 : std::string("the start"),
                   " (", again, " step", again == 1 ? "" : "s", " to run again)");
  Say(absl::StrCat(
      "generation ", job_.generation(), " ended: ", cause, "; restart ", job_.restarts(), " of ",
      config_.max_restarts(), " from ",
      survivors != nullptr
          ? absl::StrCat("the survivors' newest common step, or else from ", checkpoint)
          : checkpoint));
  // Steps after the checkpoint are run again, and committed again, by the next generation
  // (unless the survivors' checkpoint, newer, takes its place: SurvivorStageEnd).
  job_.set_step(resume_at - 1);
  if (survivors != nullptr) MaybeDecideSurvivors();
}

void JobController::ReturnToQueue(const std::string& why) {
  job_.clear_stage_status();
  rank_worker_.clear();
  effects_.rendezvous = JobEffects::Store::kClose;
  commands_reported_.clear();
  requeued_because_ = absl::StrCat("requeued: ", why);
  job_.set_message(requeued_because_);
  Say(requeued_because_);
  Changed();
}

// ---- Placement.

void JobController::StartGeneration(
    const std::vector<std::string>& placed_workers,
    const std::function<std::string(const std::string&)>& host_of, v1::JobSpec run_spec,
    int64_t start_step, const std::function<std::string(const std::string&)>& live_address) {
  const int ranks = static_cast<int>(placed_workers.size());
  std::vector<std::string> rank_workers = placed_workers;
  if (held_state_ && held_state_->step == start_step && held_state_->stages == job_.stages()) {
    // The survivors run their own stages again where they can (within their hosts): the
    // state they hold is then theirs already.
    const SurvivorHold& held = *held_state_;
    rank_workers = KeepStagesOnTheirHolders(
        placed_workers, job_.stages(),
        [&held](const std::string& id) {
          auto it = held.worker_stages.find(id);
          return it == held.worker_stages.end() ? -1 : it->second;
        },
        host_of);
  }
  Apply(GenerationStarted{ranks});
  run_spec_ = std::move(run_spec);
  effects_.rendezvous = JobEffects::Store::kOpen;
  job_.clear_message();  // it no longer waits
  requeued_because_.clear();
  if (job_.started_unix_ms() == 0) job_.set_started_unix_ms(NowMs());
  job_.clear_stage_status();
  rank_worker_ = rank_workers;
  ledger_ = StepLedger(ranks, job_.stages(), start_step, job_.step(), tokens_per_step_);
  assign_attempts_.assign(ranks, 0);
  commands_reported_.clear();
  restart_point_.Reset();
  // The step commit, so that a fault costs no step, where the survivors could go on: with
  // replicas, restarts left, and a schedule and device the commit runs under.
  job::JobSpec layout = config_;
  layout.set_stages(job_.stages());
  layout.set_replicas(job_.replicas());
  commit_steps_ = job_.replicas() > 1 && job_.restarts() < config_.max_restarts() &&
                  job::CommitStepsRefusal(layout).empty();
  if (survivors_ && survivors_->plan() && survivors_->plan()->step != start_step) {
    // Their plan was announced; say that it was not carried out, and where the job goes on.
    Say(absl::StrCat("the survivors did not go on from step ", survivors_->plan()->step,
                     " (their state was not committed): generation ", job_.generation(),
                     " starts at step ", start_step));
  }
  survivors_.reset();
  replica_state_ = ReplicaStateFor(start_step, live_address);
  if (replica_state_.layers_size() > 0) {
    std::set<std::string> holders;
    for (const auto& layer : replica_state_.layers()) {
      holders.insert(layer.addresses().begin(), layer.addresses().end());
    }
    Say(absl::StrCat("the ranks take the survivors' state at step ", start_step, " from the ",
                     holders.size(), " workers holding it (no checkpoint read)"));
  }
  std::vector<std::string> placed;
  for (int r = 0; r < ranks; ++r) {
    v1::StageStatus* st = job_.add_stage_status();
    st->set_stage(r % job_.stages());
    st->set_replica(r / job_.stages());
    st->set_worker_id(rank_workers[r]);
    st->set_step(std::max<int64_t>(-1, start_step - 1));
    st->set_state(v1::STAGE_STATE_ASSIGNED);
    // The event names the first kRanksNamed ranks' workers (one of thousands would be a
    // line of hundreds of kilobytes); `pipetrain status` has every rank's.
    if (r < kRanksNamed) placed.push_back(absl::StrCat(RankName(job_, r), " on ", rank_workers[r]));
  }
  const std::string more = ranks > kRanksNamed ? absl::StrCat(" and ", ranks - kRanksNamed,
                                                              " more ranks (`pipetrain status ",
                                                              job_.id(), "` lists every one)")
                                               : "";
  Say(absl::StrCat(
      job_.generation() > 1 ? absl::StrCat("generation ", job_.generation(), " ") : std::string(),
      "running: ", absl::StrJoin(placed, ", "), more));
  Changed();
}

void JobController::Recover(const coordinator::StartGeneration& start,
                            const std::function<std::string(const std::string&)>& host_of,
                            const std::function<std::string(const std::string&)>& live_address) {
  job_.set_stages(start.layout.stages);
  job_.set_replicas(start.layout.replicas);
  v1::Recovery* rec = job_.mutable_recoveries(job_.recoveries_size() - 1);
  rec->set_stages(start.layout.stages);
  rec->set_replicas(start.layout.replicas);
  rec->set_microbatches(start.layout.micro_batches);
  rec->set_placed_unix_ms(NowMs());
  if (!start.announcement.empty()) Say(start.announcement);
  StartGeneration(start.rank_workers, host_of, start.run_spec, start.start_step, live_address);
}

namespace {

// `text` with every run of digits as '#': "needs 8 workers, 3 idle" -> "needs # workers, # idle".
std::string WithoutCounts(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      if (out.empty() || out.back() != '#') out.push_back('#');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

void JobController::WaitsInQueue(const std::string& waiting) {
  const std::string reason =
      requeued_because_.empty() ? waiting : absl::StrCat(requeued_because_, "; ", waiting);
  if (job_.message() == reason) return;
  // Why it waits, in `status` and (when it changes) in its events; the same reason with
  // other counts (workers registering one by one, thousands of them) only in `status`,
  // written with progress (at most once a second).
  const bool counts_only = WithoutCounts(job_.message()) == WithoutCounts(reason);
  job_.set_message(reason);
  if (!counts_only) Say(absl::StrCat("queued: ", waiting));
  Changed(/*progress_only=*/counts_only);
}

void JobController::WaitsToRecover(const std::string& why) {
  // Why it waits, in `status` (and, when it starts waiting, its events).
  if (job_.message() == why) return;
  if (!absl::StrContains(job_.message(), "; waits for workers to restart on: ")) Say(why);
  job_.set_message(why);
  Changed();
}

void JobController::MoveRank(int rank, const std::string& worker_id, const std::string& failed) {
  rank_worker_[rank] = worker_id;
  job_.mutable_stage_status(rank)->set_worker_id(worker_id);
  Say(absl::StrCat(failed, "; assigned to ", worker_id, " instead"));
  Changed();
}

bool JobController::Activity(int rank, const std::string& worker_id, const std::string& action,
                             const std::string& waiting_for) {
  if (rank < 0 || rank >= job_.stage_status_size() || rank_worker_[rank] != worker_id) {
    return false;
  }
  v1::StageStatus* st = job_.mutable_stage_status(rank);
  if (st->action() == action && st->waiting_for() == waiting_for) return false;
  st->set_action(action);
  st->set_waiting_for(waiting_for);
  return true;
}

// ---- Step reports.

void JobController::ReportStep(const v1::StepReport& r) {
  // The job restarts from it once every step before it is committed here too (below).
  restart_point_.Reported(r.step() + 1, r.checkpoint_committed(), job_.checkpoint_step());
  v1::StageStatus* st = job_.mutable_stage_status(r.rank());
  st->set_step(r.step());
  st->set_compute_s(r.compute_s());
  st->set_wait_s(r.wait_s());
  st->set_parameter_bytes(r.parameter_bytes());
  st->set_peak_memory_bytes(r.peak_memory_bytes());
  st->set_peak_tensor_bytes(r.peak_tensor_bytes());
  st->set_layers_begin(r.layers_begin());
  st->set_layers_end(r.layers_end());
  *st->mutable_breakdown() = r.breakdown();
  st->set_state(v1::STAGE_STATE_RUNNING);
  const StepLedger::Recorded recorded = ledger_.Record(r);
  job_.set_step(ledger_.committed());
  for (size_t s = 0; s < recorded.straggler_ratios.size(); ++s) {
    job_.mutable_stage_status(recorded.replica_first_rank + static_cast<int>(s))
        ->set_straggler_ratio(recorded.straggler_ratios[s]);
  }
  if (recorded.tokens_per_s) job_.set_tokens_per_s(*recorded.tokens_per_s);
  if (recorded.step_time_s) job_.set_step_time_s(*recorded.step_time_s);
  if (!r.resumed_from().empty() && r.rank() == 0) {
    job_.set_resumed_from(r.resumed_from().substr(0, 4096));
    job_.clear_checkpoints_passed_over();
    for (int i = 0; i < r.passed_over_size() && i < 16; ++i) {
      const std::string why = r.passed_over(i).substr(0, kMaxErrorBytes);
      *job_.add_checkpoints_passed_over() = why;
      Say(absl::StrCat("resuming: passed over ", why));
    }
    Say(absl::StrCat("resumed from ", job_.resumed_from(),
                     r.passed_over_size() > 0 ? absl::StrCat(" (", r.passed_over_size(),
                                                             " newer checkpoint(s) passed over)")
                                              : std::string()));
  }
  if (!r.state_from_replicas().empty() && r.rank() == 0) {
    // This generation read no checkpoint.
    job_.clear_resumed_from();
    job_.clear_checkpoints_passed_over();
  }
  if (!r.state_from_replicas().empty() && r.rank() < kRanksNamed) {
    Say(absl::StrCat(RankName(job_, r.rank()), " took ",
                     r.state_from_replicas().substr(0, kMaxErrorBytes)));
  }
  // Every rank skips the same steps: the first report of a skip counts it (the step that
  // fails a job by its nonfinite_limit may be reported by one rank only before the others
  // stop), a step run again after a restart once.
  if (r.skipped() && skipped_steps_.insert(r.step()).second) {
    job_.set_skipped_steps(job_.skipped_steps() + 1);
    Say(absl::StrCat("step ", r.step(),
                     " skipped: its loss or gradients were not finite "
                     "(weights and optimizer state unchanged)"));
  }
  if (!r.checkpoint_failed().empty()) {
    Say(absl::StrCat(
        "checkpoint before step ", r.step() + 1, " failed on ", RankName(job_, r.rank()), ": ",
        r.checkpoint_failed().substr(0, kMaxErrorBytes),
        " (the job goes on; its restart point stays at step ", job_.checkpoint_step(), ")"));
  }
  // After the last step only the policy's final checkpoint comes: its commit is its event.
  // The commands took effect at a boundary once every rank has reported them there.
  if (r.commands_after_size() > 0 && r.step() + 1 < config_.steps() &&
      ++commands_reported_[r.step() + 1] == job_.stage_status_size()) {
    uint32_t bits = 0;
    for (int c : r.commands_after()) {
      bits |= jobspec::StepCommandBit(static_cast<v1::StepCommand>(c));
    }
    Say(absl::StrCat(control::StepCommandsName(bits), " took effect before step ", r.step() + 1,
                     " on all ", job_.stage_status_size(), " ranks"));
  }
  if (!recorded.committed.empty()) {
    CommitSteps(recorded.committed);
    const int64_t done = job_.step();
    const RestartPoint::Decision moved =
        restart_point_.Committed(done, job_.checkpoint_step(), config_.steps());
    if (moved.final_one) {
      Say(absl::StrCat("final checkpoint (after step ", moved.final_one->step - 1,
                       ") committed: ", moved.final_one->dir));
    }
    if (moved.restart_point) {
      // Written at once, with the rows of the steps before it (the store writes steps
      // first): a restart finds every step before the checkpoint it resumes from.
      job_.set_checkpoint_step(moved.restart_point->step);
      job_.set_checkpoint_path(moved.restart_point->dir);
      Say(absl::StrCat("checkpoint before step ", job_.checkpoint_step(),
                       " committed: ", job_.checkpoint_path()));
      Changed();
    }
    if (moved.drained) {
      Apply(Fault{*moved.drained});
      return;
    }
    if (job_.recoveries_size() > 0 &&
        job_.recoveries(job_.recoveries_size() - 1).generation() == job_.generation() &&
        job_.recoveries(job_.recoveries_size() - 1).first_step_unix_ms() == 0) {
      v1::Recovery* rec = job_.mutable_recoveries(job_.recoveries_size() - 1);
      rec->set_first_step_unix_ms(NowMs());
      Say(absl::StrFormat(
          "generation %d: step %d done by every rank, %.2f s after the fault "
          "(placed after %.2f s)",
          job_.generation(), done, (rec->first_step_unix_ms() - rec->detected_unix_ms()) / 1e3,
          (rec->placed_unix_ms() - rec->detected_unix_ms()) / 1e3));
      Changed();
    }
    const int64_t every = std::max(1, job_.steps() / 10);
    if ((done + 1) % every == 0 || done + 1 == job_.steps()) {
      Say(absl::StrCat(absl::StrFormat("step %d/%d loss %.4f lr %.3g", done + 1, job_.steps(),
                                       job_.loss(), job_.learning_rate()),
                       job_.has_grad_norm() ? absl::StrFormat(" grad norm %.4g", job_.grad_norm())
                                            : std::string(),
                       absl::StrFormat(" %.0f %s/s", job_.tokens_per_s(), job_.data_unit())));
    }
  }
  Changed(/*progress_only=*/true);
}

void JobController::CommitSteps(const std::vector<StepLedger::CommittedStep>& steps) {
  // The loss of a step is known once every replica's last stage reported it. The step is
  // committed: its row (replacing one an earlier generation wrote) goes to the store.
  for (const StepLedger::CommittedStep& step : steps) {
    StoredStep row;
    row.step = step.step;
    row.generation = job_.generation();
    row.unix_ms = NowMs();
    if (step.loss) {
      // The job's loss is its last finite one: a skipped step's may be NaN.
      if (std::isfinite(*step.loss)) job_.set_loss(*step.loss);
      row.has_loss = true;
      row.loss = *step.loss;
    }
    // A step skipped in a generation that did not get past it, and not skipped when run
    // again, no longer counts (its skip is counted when reported: ReportStep).
    if (!step.skipped && skipped_steps_.erase(step.step) > 0) {
      job_.set_skipped_steps(std::max<int64_t>(0, job_.skipped_steps() - 1));
    }
    job_.set_learning_rate(
        weights::LearningRateAt(job::OptimizerConfigOf(config_), step.step, config_.steps()));
    job_.set_has_grad_norm(step.grad_norm.has_value());
    if (step.grad_norm) {
      job_.set_grad_norm(*step.grad_norm);
      row.has_grad_norm = true;
      row.grad_norm = *step.grad_norm;
    }
    if (step.eval_loss && step.eval_accuracy) {
      job_.set_eval_step(step.step + 1);
      job_.set_eval_loss(*step.eval_loss);
      job_.set_eval_accuracy(*step.eval_accuracy);
      row.has_eval = true;
      row.eval_loss = *step.eval_loss;
      row.eval_accuracy = *step.eval_accuracy;
      Say(absl::StrFormat("held-out data before step %d: loss %.4f accuracy %.4f", step.step + 1,
                          *step.eval_loss, *step.eval_accuracy));
    }
    effects_.steps.push_back(row);
  }
}

void JobController::ReportLateStep(const v1::StepReport& r) {
  if (ledger_.Expects(ledger_.last_step(r.rank()), r.step()) != StepLedger::Order::kNext ||
      r.step() < 0 || r.step() >= job_.steps() ||
      !CheckStepReportFields(r, job_.stages(), "a late report").ok()) {
    return;
  }
  // Rows of steps every rank finished after all (a row of a step run again is replaced).
  CommitSteps(ledger_.Record(r).committed);
}

void JobController::StageEnd(const v1::StageEnd& end) {
  if (survivors_ && end.generation() == job_.generation()) SurvivorStageEnd(end);
  StageEnded ended;
  ended.rank = end.rank();
  ended.ok = end.ok();
  ended.failed_after_peer = end.failed_after_peer();
  ended.failure =
      absl::StrCat(RankName(job_, end.rank()), " on ", end.worker_id(), " failed: ", end.error());
  ended.at = settings_.clock->Now();
  Apply(ended);
}

void JobController::CommandScheduled(v1::StepCommand command, const std::string& name,
                                     int64_t boundary) {
  if (command == v1::STEP_COMMAND_STOP) Apply(StopScheduled{boundary});
  Say(absl::StrCat(name, " scheduled before step ", boundary));
  Changed();
}

void JobController::Drain(const std::string& worker_id, const std::string& address,
                          int64_t boundary) {
  if (run_.phase == Phase::kRecovering) return;
  restart_point_.Drain(worker_id, address, boundary);
  Say(absl::StrCat(worker_id, " is stopping (drained): checkpoint scheduled before step ",
                   restart_point_.drain_step(), "; the job restarts from it without this worker"));
  Changed();
}

void JobController::WorkerLost(int rank, int64_t generation, absl::Duration silent,
                               const std::string& what, const std::string& why,
                               absl::Duration lease) {
  if (job_.state() != v1::JOB_STATE_RUNNING) return;
  const bool current = generation == 0 || generation == job_.generation();
  if (current) {
    // Silent, it may still run its rank until its lease ends (then it stops it itself).
    lost_ranks_stop_by_ = std::max(lost_ranks_stop_by_, settings_.clock->Now() - silent + lease +
                                                            settings_.heartbeat_interval);
  }
  // Its rank will not say where it stands.
  if (survivors_ && current) SurvivorGone(rank);
  // A worker of an earlier generation, still ending its stage: nothing more to fail (the
  // recovering job no longer waits for it).
  if (run_.phase == Phase::kRecovering || !current) return;
  Apply(RankLost{rank, absl::StrCat(what, " running ", RankName(job_, rank), " ", why)});
}

void JobController::Tick() { MaybeDecideSurvivors(); }

// ---- The survivors of a fault: with the step commit (StageAssignment.commit_steps), the
// ranks whose runs stopped after a rank failed or was lost report where their weights stand;
// the generation's round decides the newest step every place of the pipeline has a survivor
// at; the survivors told to write their state do so as the checkpoint before that step
// through the job's store (the committing one says so in its StageEnd); and that checkpoint
// becomes the job's restart point, every step before it committed. Any other outcome (a
// place no replica of survived, a write that failed, the round given up) leaves the restart
// point where it was: the job restarts from its last checkpoint, as it would without the
// commit.

SurvivorRound* JobController::Survivors() {
  if (!commit_steps_) return nullptr;
  if (!survivors_) {
    survivors_.emplace(static_cast<int>(rank_worker_.size()), job_.stages());
    // Ranks that ended before the round began (lost, or failed before they could report)
    // will not report.
    for (size_t r = 0; r < run_.rank_ended.size(); ++r) {
      if (run_.rank_ended[r]) survivors_->Gone(static_cast<int>(r));
    }
  }
  return &*survivors_;
}

void JobController::SurvivorGone(int rank) {
  SurvivorRound* round = Survivors();
  if (round == nullptr || round->decided()) return;
  round->Gone(rank);
  MaybeDecideSurvivors();
}

void JobController::MaybeDecideSurvivors() {
  if (!survivors_ || survivors_->decided() || run_.phase != Phase::kRecovering) return;
  const bool late =
      settings_.clock->Now() >= recovering_since_ + kRoundIntervals * settings_.heartbeat_interval;
  if (!survivors_->AllAccounted() && !late) return;
  survivors_->Decide();
  const std::optional<recovery::SurvivorPlan>& plan = survivors_->plan();
  if (!plan) {
    effects_.rendezvous = JobEffects::Store::kClose;
    Say(absl::StrCat("the survivors cannot go on (", survivors_->why_not(),
                     "): restarting from the last checkpoint"));
    return;
  }
  // The survivors meet in a store of their own: nothing the generation left there (a
  // checkpoint it had begun) counts towards theirs.
  effects_.rendezvous = JobEffects::Store::kOpen;
  // What they hold in memory for the next generation, and where.
  held_state_ = SurvivorHold::FromRound(*survivors_, rank_worker_, job_.stages(), rpc::RandomKey());
  effects_.began_holding = true;
  // An intention until their state is committed (SurvivorStageEnd); StartGeneration says so
  // if the next generation starts elsewhere.
  Say(absl::StrCat("the survivors' plan: go on from step ", plan->step, " once ",
                   plan->sources.size(), " of them wrote their stage's state (",
                   plan->apply_held.size(), " apply their held update first)",
                   late && !survivors_->AllAccounted()
                       ? ", without the ranks that did not report in time"
                       : ""));
}

absl::StatusOr<v1::SurvivorInstruction> JobController::Stopped(const v1::StoppedRank& s) {
  v1::SurvivorInstruction abandon;
  abandon.set_action(v1::SurvivorInstruction::ABANDON);
  SurvivorRound* round = Survivors();
  if (round == nullptr) {
    abandon.set_reason(absl::StrCat(s.job_id(), " does not commit its steps"));
    return abandon;
  }
  const std::string where = absl::StrCat("job ", s.job_id(), " rank ", s.rank());
  if (s.next_step() < 0 || s.held_step() < -1 ||
      (s.held_step() >= 0 && s.held_step() != s.next_step())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": next step ", s.next_step(), ", held step ", s.held_step()));
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
    if (run_.phase != Phase::kRecovering) {
      StageEnded ended;
      ended.rank = s.rank();
      ended.ok = false;
      ended.failed_after_peer = s.failed_after_peer();
      ended.failure = absl::StrCat(RankName(job_, s.rank()), " on ", s.worker_id(),
                                   " failed: ", s.error().substr(0, kMaxErrorBytes));
      ended.at = settings_.clock->Now();
      Apply(ended);
      // The generation is over: the ranks still running are stopped now, so that they
      // report too (one waiting on this rank would otherwise wait until the job machine
      // decides, as this rank keeps its connections open while it waits for the plan).
      if (round->reports() == 1 && IsRunning(run_.phase) && run_.phase != Phase::kRecovering) {
        std::vector<int> running;
        for (size_t r = 0; r < run_.rank_ended.size(); ++r) {
          if (!run_.rank_ended[r]) running.push_back(static_cast<int>(r));
        }
        Stop(running, absl::StrCat(RankName(job_, s.rank()), " stopped (", s.error().substr(0, 200),
                                   "): the survivors report where they stand"));
      }
    }
  }
  MaybeDecideSurvivors();
  v1::SurvivorInstruction answer = survivors_->InstructionFor(s.rank());
  if (answer.hold_state() && held_state_ && held_state_->step == answer.step()) {
    answer.set_state_key(held_state_->key);
    answer.set_hold_ms(absl::ToInt64Milliseconds(kLongestHold));
  } else {
    answer.set_hold_state(false);
  }
  if (answer.action() == v1::SurvivorInstruction::WAIT) {
    // Decided within three intervals of the generation's end, which is at most two
    // intervals away (a lost worker's) or, for a held failure, one and a half.
    const absl::Duration interval = settings_.heartbeat_interval;
    const absl::Time now = settings_.clock->Now();
    const absl::Time by =
        (run_.phase == Phase::kRecovering ? recovering_since_ : now + 2 * interval) +
        kRoundIntervals * interval;
    answer.set_wait_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(by - now)) +
                       absl::ToInt64Milliseconds(interval));
  }
  return answer;
}

void JobController::SurvivorStageEnd(const v1::StageEnd& end) {
  SurvivorRound& round = *survivors_;
  if (!round.reported(end.rank())) {
    SurvivorGone(end.rank());
    return;
  }
  const std::optional<recovery::SurvivorPlan>& plan = round.plan();
  if (!plan || run_.phase != Phase::kRecovering) return;
  if (!end.survivor_failed().empty()) {
    Say(absl::StrCat("the survivors' state before step ", plan->step,
                     " was not written: ", RankName(job_, end.rank()), ": ",
                     end.survivor_failed().substr(0, kMaxErrorBytes),
                     " (the job restarts from its last checkpoint)"));
    return;
  }
  if (end.survivor_checkpoint().empty() || end.survivor_step() != plan->step) return;
  // Every step before it is done: the survivors finished it or applied its update.
  CommitSteps(ledger_.CommitThrough(plan->step - 1, round.held_loss()));
  job_.set_step(plan->step - 1);
  job_.set_checkpoint_step(plan->step);
  job_.set_checkpoint_path(end.survivor_checkpoint().substr(0, 4096));
  if (job_.recoveries_size() > 0) {
    v1::Recovery* rec = job_.mutable_recoveries(job_.recoveries_size() - 1);
    rec->set_resumed_at_step(plan->step);
    rec->set_from_survivors(true);
  }
  // The next generation need not wait for a lost worker's lease: a rank it may still run
  // (cut off from here) has no peer left to go on with (every other rank of its generation
  // has stopped), any layer file it could still write holds the bytes its surviving replicas
  // hold for that step (replicas are bitwise equal), and its calls on the job's store are
  // refused once the next generation runs.
  lost_ranks_stop_by_ = absl::InfinitePast();
  Say(absl::StrCat("the survivors' state before step ", plan->step,
                   " committed: ", job_.checkpoint_path(), ": the survivors go on from step ",
                   plan->step, " (no step to run again)"));
  Changed();
}

v1::ReplicaState JobController::ReplicaStateFor(
    int64_t start_step, const std::function<std::string(const std::string&)>& live_address) {
  if (!held_state_) return v1::ReplicaState();
  SurvivorHold::ForGeneration taken = held_state_->StateFor(start_step, live_address);
  if (taken.missing_layer) {
    Say(absl::StrCat("no worker holding layer ", *taken.missing_layer,
                     " of the survivors' state is left: the next generation reads the "
                     "checkpoint before step ",
                     start_step));
  }
  return std::move(taken.state);
}

bool JobController::KeepsHeldState() {
  // Needed until the job has committed the step again (the next generation then holds it)
  // or has ended.
  if (held_state_ && !IsFinal(run_.phase) && held_state_->NeededAfter(job_.step())) return true;
  held_state_.reset();
  return false;
}

}  // namespace pipetrain::coordinator
