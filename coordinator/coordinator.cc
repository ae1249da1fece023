// The coordinator's shell: opening (the store loaded back, running jobs restarted or marked
// interrupted), the write-behind of changes and events, calls to workers off the lock, the
// job machine's commands carried out on a job's record (job_machine.h), and the monitor
// (lost workers, held failures decided, scheduling). The handlers live by concern in
// coordinator_jobs.cc, coordinator_workers.cc, coordinator_reports.cc and
// coordinator_scheduling.cc. See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "jobspec/job_config_from_spec.h"
#include "proto/states.h"
#include "runtime/base/rank_layout.h"

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


}  // namespace

std::string Coordinator::RankName(const v1::Job& job, int rank) {
  return RankLayout{job.stages(), job.replicas()}.Describe(rank);
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(options.db_path);
  if (!store.ok()) return store.status();
  CoordinatorDeps deps;
  deps.store = *std::move(store);
  return Open(options, std::move(deps));
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options,
                                                               CoordinatorDeps deps) {
  if (!deps.store) return absl::InvalidArgumentError("a coordinator needs a job store");
  if (!deps.clock) deps.clock = std::make_shared<RealClock>();
  if (!deps.connect) deps.connect = GrpcWorkerConnector(options.security);
  const bool monitor = deps.start_monitor;
  std::unique_ptr<Coordinator> c(new Coordinator(options, std::move(deps)));
  if (absl::Status s = c->Load(); !s.ok()) return s;
  if (monitor) {
    c->last_pass_ms_.store(absl::ToUnixMillis(c->deps_.clock->Now()));
    c->monitor_ = std::thread([raw = c.get()] { raw->Monitor(); });
  }
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, CoordinatorDeps deps)
    : options_(std::move(options)),
      deps_(std::move(deps)),
      planner_({options_.planning_cpu_budget, options_.planning_time_limit,
                options_.planning_wait, options_.host_links}),
      scheduler_(SchedulerPolicy{options_.heartbeat_interval, options_.assign_attempts,
                                 options_.host_policy, options_.host_links}),
      writes_(deps_.store.get()),
      jobs_(&writes_, deps_.clock, [this] { changed_.SignalAll(); }) {
  absl::MutexLock lock(&mu_);
  pool_.SetLostListener([this](const WorkerPool::Lost& lost) {
    mu_.AssertHeld();  // the pool is only used under mu_
    OnWorkerLost(lost);
  });
}

int64_t Coordinator::NowMs() const { return absl::ToUnixMillis(deps_.clock->Now()); }

void Coordinator::StopMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  changed_.SignalAll();
  if (monitor_.joinable()) monitor_.join();
}

Coordinator::~Coordinator() {
  StopMonitor();
  // calls_, declared last, is destroyed first: it runs what is queued, then joins.
}

absl::Status Coordinator::Load() {
  auto stored = deps_.store->LoadJobs();
  if (!stored.ok()) return stored.status();
  {
  absl::MutexLock lock(&mu_);
  for (const StoredJob& s : *stored) {
    JobEntry entry;
    entry.durable = true;
    if (!entry.job.ParseFromString(s.job)) {
      return absl::DataLossError(absl::StrCat("job store: job ", s.id, " is unreadable"));
    }
    auto config = jobspec::JobConfigFromSpec(entry.job.spec());
    if (config.ok()) entry.config = *config;
    entry.run = RunFromRecord(entry.job);
    JobEntry& e = jobs_.Add(s.id, std::move(entry));
    if (e.job.state() == v1::JOB_STATE_RUNNING && config.ok() &&
        e.job.restarts() < e.config.max_restarts) {
      // Its workers stop their stages when their next heartbeat is refused and register
      // again; the job waits for them (PlaceRecovering).
      ApplyEvent(e, Fault{absl::StrCat("the coordinator restarted (", e.job.step() + 1, " of ",
                                       e.job.steps(), " steps recorded)")});
    } else if (e.job.state() == v1::JOB_STATE_RUNNING) {
      // Not a transition of its life but what was found: it ran when the coordinator stopped.
      e.run.phase = Phase::kFailed;
      e.job.set_state(v1::JOB_STATE_FAILED);
      // Progress is written at most once a second: the steps recorded, not those run.
      e.job.set_message(absl::StrCat("interrupted by a coordinator restart (", e.job.step() + 1,
                                     " of ", e.job.steps(), " steps recorded); its workers stop ",
                                     "their stages and rejoin the pool"));
      e.job.set_finished_unix_ms(NowMs());
      for (auto& st : *e.job.mutable_stage_status()) {
        if (st.state() != v1::STAGE_STATE_DONE) st.set_state(v1::STAGE_STATE_INTERRUPTED);
      }
      jobs_.Event(s.id, e.job.message());
      jobs_.Changed(e);
    }
  }
  }
  if (absl::Status s = FlushWrites(); !s.ok()) {
    std::fprintf(stderr, "coordinator: %s\n", std::string(s.message()).c_str());
  }
  return absl::OkStatus();
}

absl::Status Coordinator::FlushWrites() { return writes_.Flush(); }

void Coordinator::Later(std::function<void()> call) {
  if (deps_.run_later) {
    deps_.run_later(std::move(call));
    return;
  }
  calls_.Run(std::move(call));
}

void Coordinator::ApplyEvent(JobEntry& e, const JobEvent& event) {
  const JobRun before = e.run;
  Transition t = Apply(e.run, event, RestartPolicy{e.config.max_restarts});
  e.run = std::move(t.run);
  e.job.set_state(JobStateOf(e.run.phase));
  e.job.set_restarts(e.run.restarts);
  e.job.set_generation(e.run.generation);
  for (const JobCommand& command : t.commands) {
    if (const auto* stop = std::get_if<StopRanks>(&command)) {
      SendStops(e, stop->ranks, stop->reason);
    } else if (const auto* mark = std::get_if<MarkStage>(&command)) {
      v1::StageStatus* st = e.job.mutable_stage_status(mark->rank);
      if (mark->mark == StageMark::kLost) {
        st->set_state(v1::STAGE_STATE_LOST);
      } else {
        st->set_state(mark->mark == StageMark::kDone ? v1::STAGE_STATE_DONE
                                                     : v1::STAGE_STATE_FAILED);
        st->set_action("");
        st->set_waiting_for("");
      }
    } else if (const auto* say = std::get_if<Announce>(&command)) {
      jobs_.Event(e.job.id(), say->text);
    } else if (const auto* recover = std::get_if<BeginRecovery>(&command)) {
      RecordRecovery(e, *recover);
    } else if (const auto* end = std::get_if<EndJob>(&command)) {
      RecordEnd(e, end->message);
    } else if (const auto* requeue = std::get_if<Requeue>(&command)) {
      ReturnToQueue(e, requeue->why);
    }
  }
  // A change of the job's phase, generation or stop step is written at once; what only
  // marks ranks (a rank of thousands ending) is progress, written at most once a second (a
  // job of 4,096 ranks would otherwise be serialized and written once per rank).
  if (e.run.phase != before.phase || e.run.stop_step != before.stop_step ||
      e.run.generation != before.generation) {
    jobs_.Changed(e);
  } else if (!t.commands.empty()) {
    jobs_.Changed(e, /*progress_only=*/true);
  }
}

void Coordinator::RecordEnd(JobEntry& e, const std::string& message) {
  e.job.set_message(message);
  e.job.set_finished_unix_ms(NowMs());
  if (e.run.phase == Phase::kSucceeded) {
    // The loss is the last finite one: say so when the last steps were skipped.
    const int skipped_last = SkippedInARowBefore(e.skipped_steps, e.job.steps());
    jobs_.Event(e.job.id(),
                absl::StrCat(absl::StrFormat("succeeded: %d steps, final loss %.4f", e.job.steps(),
                                             e.job.loss()),
                             skipped_last > 0
                                 ? absl::StrCat(" (step ", e.job.steps() - skipped_last - 1,
                                                "'s: the last ", skipped_last, " skipped, their "
                                                "loss or gradients not finite)")
                                 : std::string(),
                             absl::StrFormat(", %.1f s", (e.job.finished_unix_ms() -
                                                          e.job.started_unix_ms()) / 1e3)));
  } else {
    jobs_.Event(e.job.id(), absl::StrCat(e.run.phase == Phase::kCancelled ? "cancelled" : "failed",
                                   ": ", message));
  }
  rendezvous_.Close(e.job.id());
  commands_.Forget(e.job.id());
}

void Coordinator::SendStops(JobEntry& e, const std::vector<int>& ranks,
                            const std::string& reason) {
  for (int r : ranks) {
    if (r < 0 || r >= static_cast<int>(e.rank_worker.size())) continue;
    WorkerPool::Worker* w = pool_.Find(e.rank_worker[r]);
    if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) continue;
    std::shared_ptr<WorkerClient> client = w->client;
    v1::StopStageRequest request;
    request.set_job_id(e.job.id());
    request.set_generation(e.job.generation());
    request.set_reason(reason);
    Later([client, request] { (void)client->StopStage(request); });
  }
}

void Coordinator::RecordRecovery(JobEntry& e, const BeginRecovery& recovery) {
  const std::string& cause = recovery.cause;
  e.recovering_since = deps_.clock->Now();
  commands_.Forget(e.job.id());
  // The survivors of a failed or lost rank may go on from their newest common step: the
  // generation's store stays for their round (coordinator_survivors.cc). A Fault names its
  // own restart point: its round, begun or not, is over.
  SurvivorRound* survivors = SurvivorsOf(e);
  if (survivors != nullptr && !recovery.survivors) {
    survivors->Abandon(absl::StrCat("the generation ended: ", cause));
    survivors = nullptr;
  }
  if (survivors == nullptr) rendezvous_.Close(e.job.id());
  for (auto& st : *e.job.mutable_stage_status()) {
    if (st.state() != v1::STAGE_STATE_DONE && st.state() != v1::STAGE_STATE_FAILED &&
        st.state() != v1::STAGE_STATE_LOST) {
      st.set_state(v1::STAGE_STATE_STOPPING);
    }
  }
  const int64_t resume_at = e.job.checkpoint_step();
  v1::Recovery* rec = e.job.add_recoveries();
  rec->set_generation(e.job.generation() + 1);
  rec->set_cause(cause.substr(0, kMaxErrorBytes));
  rec->set_failed_after_step(e.job.step());
  rec->set_resumed_at_step(resume_at);
  rec->set_detected_unix_ms(NowMs());
  const int64_t again = std::max<int64_t>(0, e.job.step() + 1 - resume_at);
  e.job.set_message(absl::StrCat("recovering (restart ", e.job.restarts(), " of ",
                                 e.config.max_restarts, "): ", cause));
  const std::string checkpoint =
      absl::StrCat(resume_at > 0 ? absl::StrCat("the checkpoint before step ", resume_at)
                                 : std::string("the start"),
                   " (", again, " step", again == 1 ? "" : "s", " to run again)");
  jobs_.Event(e.job.id(),
              absl::StrCat("generation ", e.job.generation(), " ended: ", cause, "; restart ",
                           e.job.restarts(), " of ", e.config.max_restarts, " from ",
                           survivors != nullptr
                               ? absl::StrCat("the survivors' newest common step, or else from ",
                                              checkpoint)
                               : checkpoint));
  // Steps after the checkpoint are run again, and committed again, by the next generation
  // (unless the survivors' checkpoint, newer, takes its place: SurvivorStageEnd).
  e.job.set_step(resume_at - 1);
  if (survivors != nullptr) MaybeDecideSurvivors(e);
}

void Coordinator::ReturnToQueue(JobEntry& e, const std::string& why) {
  e.job.clear_stage_status();
  e.rank_worker.clear();
  rendezvous_.Close(e.job.id());
  commands_.Forget(e.job.id());
  e.requeued_because = absl::StrCat("requeued: ", why);
  e.job.set_message(e.requeued_because);
  jobs_.Event(e.job.id(), e.requeued_because);
  jobs_.Changed(e);
}

void Coordinator::TickLocked() {
  const absl::Time now = deps_.clock->Now();
  for (const std::string& id : pool_.RemoveLostFor(now, options_.lost_worker_ttl)) {
    std::fprintf(stderr, "coordinator: %s forgotten (lost for over %s)\n", id.c_str(),
                 absl::FormatDuration(options_.lost_worker_ttl).c_str());
  }
  workers_lost_silent_ += pool_.ExpireSilent(now, 2 * options_.heartbeat_interval);
  // A held-back rank failure becomes the job's once every worker of a rank still running
  // has heartbeated more than half an interval after it (so that a heartbeat sent before
  // a peer died, still on its way, does not count); a lost one ended the job above.
  for (auto& [id, e] : jobs_) {
    if (e.run.phase != Phase::kHeldFailure) continue;
    bool alive = true;
    for (size_t r = 0; r < e.rank_worker.size() && r < e.run.rank_ended.size(); ++r) {
      const WorkerPool::Worker* w = pool_.Find(e.rank_worker[r]);
      if (!e.run.rank_ended[r] && w != nullptr &&
          w->last_heartbeat <= e.run.held_since + options_.heartbeat_interval / 2) {
        alive = false;
      }
    }
    if (alive) ApplyEvent(e, PeersAlive{});
  }
  // Survivors' rounds past their deadline decide without the ranks that did not report.
  for (auto& [id, e] : jobs_) MaybeDecideSurvivors(e);
  Schedule();
}

void Coordinator::Tick() {
  LockedThenFlush([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TickLocked();
    return 0;
  });
}

void Coordinator::Monitor() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Until the next worker is due to be lost (so that it is lost two intervals after its
    // last heartbeat, not up to a tick later), or a quarter interval at most.
    const absl::Duration wait = std::min(
        std::max(absl::Milliseconds(10), options_.heartbeat_interval / 4),
        pool_.NextExpiry(2 * options_.heartbeat_interval) + absl::Milliseconds(1) -
            deps_.clock->Now());
    // Woken early only to stop (job changes do not count).
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             std::max(absl::Milliseconds(1), wait))) {
      break;
    }
    TickLocked();
    mu_.Unlock();
    (void)FlushWrites();
    last_pass_ms_.store(absl::ToUnixMillis(deps_.clock->Now()));
    mu_.Lock();
  }
}

bool Coordinator::StateLoopLive() const {
  if (!monitor_.joinable()) return true;
  const absl::Time last = absl::FromUnixMillis(last_pass_ms_.load());
  return deps_.clock->Now() - last <= options_.stall_limit;
}

}  // namespace pipetrain::coordinator
