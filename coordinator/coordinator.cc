// The coordinator's shell: opening (the store loaded back into jobs' controllers), the
// write-behind of changes and events, calls to workers off the lock, a controller's effects
// carried out (Carry), and the monitor (lost workers, held failures decided, survivors'
// deadlines, scheduling). The handlers live by concern in
// coordinator_jobs.cc, coordinator_workers.cc, coordinator_reports.cc and
// coordinator_scheduling.cc. See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "jobspec/job_config_from_spec.h"
#include "proto/states.h"

namespace pipetrain::coordinator {

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
    v1::Job job;
    if (!job.ParseFromString(s.job)) {
      return absl::DataLossError(absl::StrCat("job store: job ", s.id, " is unreadable"));
    }
    absl::StatusOr<job::JobConfig> config = jobspec::JobConfigFromSpec(job.spec());
    JobEntry& e = jobs_.Add(
        s.id, JobEntry(JobController::FromRecord(JobSettings(), std::move(job), config)));
    e.durable = true;
    Carry(e);
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

JobController::Settings Coordinator::JobSettings() const {
  return JobController::Settings{deps_.clock, options_.heartbeat_interval};
}

void Coordinator::Carry(JobEntry& entry) {
  const JobEffects effects = entry.controller.TakeEffects();
  const std::string& id = entry.controller.id();
  switch (effects.rendezvous) {
    case JobEffects::Store::kUnchanged: break;
    case JobEffects::Store::kOpen: rendezvous_.Open(id); break;
    case JobEffects::Store::kClose: rendezvous_.Close(id); break;
  }
  if (effects.began_holding) holding_jobs_.insert(id);
  for (const JobEffects::Stop& stop : effects.stops) {
    WorkerPool::Worker* w = pool_.Find(stop.worker_id);
    if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) continue;
    std::shared_ptr<WorkerClient> client = w->client;
    v1::StopStageRequest request;
    request.set_job_id(id);
    request.set_generation(stop.generation);
    request.set_reason(stop.reason);
    Later([client, request] { (void)client->StopStage(request); });
  }
  jobs_.Record(entry, effects);
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
    const JobRun& run = e.controller.run();
    if (run.phase != Phase::kHeldFailure) continue;
    const std::vector<std::string>& rank_worker = e.controller.rank_worker();
    bool alive = true;
    for (size_t r = 0; r < rank_worker.size() && r < run.rank_ended.size(); ++r) {
      const WorkerPool::Worker* w = pool_.Find(rank_worker[r]);
      if (!run.rank_ended[r] && w != nullptr &&
          w->last_heartbeat <= run.held_since + options_.heartbeat_interval / 2) {
        alive = false;
      }
    }
    if (alive) {
      e.controller.Apply(PeersAlive{});
      Carry(e);
    }
  }
  // Survivors' rounds past their deadline decide without the ranks that did not report.
  for (auto& [id, e] : jobs_) {
    e.controller.Tick();
    Carry(e);
  }
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
