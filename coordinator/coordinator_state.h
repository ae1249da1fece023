// What the coordinator's managers share (coordinator.h): its options, its one lock and the
// state under it — the jobs (each a controller, job_table.h), the worker pool, the running
// generations' rendezvous stores, the jobs whose survivors hold state — and the ways a
// change leaves the lock: a job's effects carried out (Carry), calls to workers queued to run
// off the lock (Later), store writes made outside it, in order (StateLock, FlushWrites).
//
// Thread-safe as annotated: every field under `mu` says so (ABSL_GUARDED_BY), and clang
// checks each manager's use of it (-Wthread-safety).
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/job_controller.h"
#include "coordinator/job_store.h"
#include "coordinator/job_table.h"
#include "coordinator/rendezvous_stores.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_pool.h"
#include "coordinator/write_behind.h"
#include "rpc/security.h"
#include "runtime/base/clock.h"

namespace pipetrain::coordinator {

struct CoordinatorOptions {
  std::string db_path = "pipetrain-coordinator.db";
  absl::Duration heartbeat_interval = absl::Seconds(1);
  rpc::SecurityOptions security;  // token and TLS for its calls to workers
  // A lost worker is listed (WORKER_STATE_LOST) this long, then forgotten.
  absl::Duration lost_worker_ttl = absl::Minutes(1);
  // A rank whose assignment fails (the worker cannot be reached) is tried on another idle
  // worker, this many times in all, before its job fails.
  int assign_attempts = 3;
  // The monitor's state loop counts as blocked once no pass completed for this long.
  absl::Duration stall_limit = absl::Seconds(5);
  // Planning at submission (`stages: auto`): one plan at a time, on a thread of its own at the
  // lowest CPU priority, stopped past this much CPU or this long (DeadlineExceeded); at most
  // SubmissionPlanner::kMaxWaitingPlans wait for their turn (up to planning_wait), the rest are
  // refused at once (ResourceExhausted).
  absl::Duration planning_cpu_budget = absl::Seconds(10);
  absl::Duration planning_time_limit = absl::Seconds(60);
  absl::Duration planning_wait = absl::Seconds(30);
  // Where a job's ranks go when the idle workers are on several hosts, and the links between
  // hosts as measured (scheduler.h).
  HostPolicy host_policy = HostPolicy::kTopology;
  planner::HostLinks host_links;
};

class CoordinatorState {
 public:
  // `store` (borrowed, outliving this): where records, steps and events are written.
  // `run_later`: runs a call to a worker off the lock (the coordinator's call pool).
  CoordinatorState(const CoordinatorOptions& options, std::shared_ptr<Clock> clock, JobStore* store,
                   std::function<void(std::function<void()>)> run_later);

  const CoordinatorOptions& options;
  const std::shared_ptr<Clock> clock;
  JobStore* const store;
  WriteBehind writes;  // queued under mu, written by FlushWrites outside it

  // The one lock; `changed` is signalled on every change of a job (WaitForChange).
  mutable absl::Mutex mu;
  absl::CondVar changed;
  JobTable jobs ABSL_GUARDED_BY(mu);  // the jobs; their changes queued into writes
  WorkerPool pool ABSL_GUARDED_BY(mu);
  RendezvousStores rendezvous ABSL_GUARDED_BY(mu);  // of the running generations
  // The jobs whose controller holds survivors' state (a heartbeat looks only at these).
  std::set<std::string> holding_jobs ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;  // the coordinator is shutting down

  // Carries out what the job's controller asked for since its effects were last taken
  // (JobEffects): its rendezvous store, the survivors' state it holds, stops sent to
  // workers off the lock, its events, steps and record queued for the store.
  void Carry(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Queues `call` to run off the lock (RPCs to workers never run under mu).
  void Later(std::function<void()> call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Writes what the job table queued (write_behind.h), in order.
  absl::Status FlushWrites() ABSL_LOCKS_EXCLUDED(mu);
  // The worker that holds `session`, if it claims to be `worker_id` (any id if empty): an
  // unknown session is NotFound (the worker registers again), another worker's id
  // PermissionDenied.
  absl::StatusOr<WorkerPool::Worker*> Caller(const std::string& session,
                                             const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What each job's controller is given (the clock, the heartbeat interval).
  JobController::Settings JobSettings() const;
  int64_t NowMs() const;

 private:
  const std::function<void(std::function<void()>)> run_later_;
};

// Holds the state's lock for a scope, then writes what the scope queued once the lock is
// released (so a caller's answer, computed inside, is durable before it leaves).
class ABSL_SCOPED_LOCKABLE StateLock {
 public:
  explicit StateLock(CoordinatorState* state) ABSL_EXCLUSIVE_LOCK_FUNCTION(state->mu)
      : state_(state) {
    state_->mu.Lock();
  }
  ~StateLock() ABSL_UNLOCK_FUNCTION() {
    state_->mu.Unlock();
    (void)state_->FlushWrites();
  }
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;

 private:
  CoordinatorState* const state_;
};

}  // namespace pipetrain::coordinator
