// The coordinator's state and rules, apart from the gRPC plumbing (service.cc):
// jobs (validated, queued, assigned, followed, persisted in the JobStore), the worker pool
// (registration, heartbeats, loss detection), and the data plane's rendezvous (a key-value
// store per running job, in memory, served to its ranks by the KV RPCs).
//
// Scheduling: queued jobs are considered in submission order; a job starts as soon as
// stages x replicas workers are idle, one rank per worker. A job ends when every rank has
// reported its end, when one rank fails (the others are told to stop), when a worker running
// it misses two heartbeat intervals, or when it is cancelled. A worker is lost as soon as two
// intervals pass without its heartbeat. A rank's failure is held back until the workers of
// the ranks still running have heartbeated since (at most 1.5 intervals): when a worker dies,
// its peers fail first ("lost stage 1"), and the job's message must name the dead worker
// and its stage, not a survivor.
//
// Recovery: a job with restarts left (spec max_restarts) is not failed by a fault (a worker
// lost or hung, a rank failed, an assignment that cannot be made, a coordinator restart):
// its generation ends (every rank still running is told to stop), and once every worker of
// that generation has reported its stage's end or been lost, the job's next generation is
// placed on idle workers, before any queued job: the same layout if enough are idle (after a
// grace of three heartbeat intervals, for workers that come back), else the best smaller one
// (placement.h RecoveryLayouts), resuming from the job's newest committed checkpoint (which
// the committing rank reports) or from its start. Generations are numbered from 1 and only
// increase; reports, stage ends and heartbeats of an older generation change nothing. Each
// step is committed once every rank of the generation has finished it (a row in the store's
// steps table); a step run again after a restart replaces its row, so every step of the job
// has exactly one. A job that finds no layout within its timeout_s fails.
//
// Survivors: a generation with replicas and restarts left runs with the step commit; when a
// rank of it fails or is lost, the ranks whose runs stopped report where they stand
// (ReportStopped), the generation's round decides the newest step they all reach, and the
// checkpoint its survivors write there becomes the restart point, every step before it
// committed: a lost replica costs no step (job_controller.h, docs/design.md 4.8).
//
// Step commands (flush, weight-version switch, checkpoint, stop at a named step) go to the
// worker of rank 0 only; the data plane carries them to every stage, and each rank's step
// report says when they took effect there (an event once every rank has).
//
// After a restart every job and event is loaded back; a job that was running restarts as
// above if it has restarts left, else is marked failed ("interrupted by a coordinator
// restart"). Either way its workers, no longer known here, stop their stages when their next
// heartbeat is refused, and register again. Worker ids are numbered in the
// store, so that none is handed out again after a restart.
//
// Parts, as Ray's GCS has them: managers that own their state and are their service's
// handlers, over what they share (coordinator_state.h: the one lock, the jobs, the worker
// pool, the rendezvous stores, and Carry, which carries out a job controller's effects):
//   JobManager     (job_manager.h)     JobService: submit, get, list, cancel, watch, events,
//                                      steps, step commands; the jobs loaded at start;
//   WorkerManager  (worker_manager.h)  CoordinatorService for workers: register, heartbeat,
//                                      deregister, drain, rendezvous; losing a worker;
//   ReportManager  (report_manager.h)  the ranks' step reports, stage ends, stopped ranks;
//   Dispatcher     (dispatcher.h)      where jobs run: the scheduler's decisions carried out.
// Each job is its controller (job_controller.h: its record, run, step ledger, restart point,
// survivors and what they hold; events in, effects out), and below those: the job machine
// (job_machine.h), the checks of a step report (report_checks.h), the worker pool
// (worker_pool.h), placement (placement.h), calls to workers (worker_client.h), planning at
// submission (submission_planner.h), the scheduler (scheduler.h), the step-command relay
// (command_relay.h), the rendezvous stores (rendezvous_stores.h), the job table
// (job_table.h), the durable store (job_store.h) and its write-behind (write_behind.h), time
// (runtime/base/clock.h). This class is the wiring: it makes the parts, loads the store,
// runs the monitor, and answers /metrics. Everything it depends on is injected
// (CoordinatorDeps), so its rules are unit-tested with a fake clock, fake workers and a
// store that fails (tests/coordinator), no sockets and no sleeps.
//
// Persistence: store writes are made outside the lock that RPC handlers take. A change
// queues the job's latest record (and its events) under the lock; the thread that made it
// writes the queue after releasing the lock, in order. A submission is acknowledged only
// once its record is durable: if the write fails, the job is dropped and the caller told.
// A state a caller is shown (Get, List, WaitForChange) is in the store before the answer
// leaves: they write what is queued before they answer (progress from step reports, written at most
// once a second, may be ahead of the store; a state change never is).
//
// Thread-safe: one absl::Mutex (CoordinatorState::mu) guards the state, each guarded field and each
// method that needs it says so (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED), and clang checks
// it
// (-Wthread-safety).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/call_pool.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/dispatcher.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_store.h"
#include "coordinator/report_manager.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_manager.h"
#include "runtime/base/clock.h"

namespace pipetrain::coordinator {

// What the coordinator talks to. Open(options) uses the real ones.
struct CoordinatorDeps {
  std::unique_ptr<JobStore> store;
  std::shared_ptr<Clock> clock;
  WorkerConnector connect;
  // Runs a call to a worker off the lock (the real one: the coordinator's CallPool).
  std::function<void(std::function<void()>)> run_later;
  // The monitor thread (heartbeat loss, held-back failures); without it, Tick() does its work.
  bool start_monitor = true;
};

class Coordinator {
 public:
  // The SQLite store at options.db_path, the wall clock, workers over gRPC.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorOptions& options);
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorOptions& options,
                                                           CoordinatorDeps deps);
  ~Coordinator();

  // The services' handlers.
  JobManager& jobs() { return jobs_; }
  WorkerManager& workers() { return workers_; }
  ReportManager& reports() { return reports_; }

  // Stops the monitor thread (no worker is declared lost from then on): first thing on
  // SIGTERM, so that heartbeats refused while the server drains are not taken for lost
  // workers (the running jobs are then "interrupted by a coordinator restart" at the next
  // start, their true cause).
  void StopMonitor();

  // One pass of the monitor at the clock's time: workers silent for two heartbeat intervals
  // are lost (failing their jobs), held-back rank failures and survivors' deadlines are
  // decided, queued jobs placed.
  void Tick();

  // Whether the monitor has completed a pass (a tick and its writes) within
  // options.stall_limit of the clock's time: false while its state loop is blocked (a lock
  // held too long, a store write that hangs), so health checks can say NOT_SERVING. Always
  // true without the monitor thread. Thread-safe, takes no lock.
  bool StateLoopLive() const;

  // What the coordinator's /metrics shows (coordinator_metrics.h), read in one pass under
  // its lock.
  struct MetricsSnapshot {
    std::map<std::string, int> jobs_by_state;     // "queued", "running", ... (every state)
    std::map<std::string, int> workers_by_state;  // "idle", "busy", ... (StateName, every state)
    struct RunningJob {
      std::string id;
      int64_t step = -1;  // last step every rank finished
      double tokens_per_s = 0;
      std::optional<double> loss;           // of the last step, from the last stage
      std::optional<double> learning_rate;  // its update's
      std::optional<double> grad_norm;      // with clipping: before it
      // With evaluation: the latest held-out loss and accuracy.
      std::optional<double> eval_loss, eval_accuracy;
      // Per pipeline stage (replica 0's rank): its compute seconds per step (a moving
      // average over recent steps) over the median stage's; empty before every stage has
      // reported two steps.
      std::vector<double> straggler_ratio;
    };
    std::vector<RunningJob> running;
    int64_t workers_lost_silent = 0;  // workers lost for missed heartbeats, since start
    int64_t coordinator_stalls = 0;   // stalls of this process excused (WorkerManager)
    // Step commands asked for, by (command, outcome): outcome "scheduled" or the refusal's
    // status code ("FAILED_PRECONDITION", ...).
    std::map<std::pair<std::string, std::string>, int64_t> step_commands;
  };
  MetricsSnapshot Metrics();

 private:
  Coordinator(CoordinatorOptions options, CoordinatorDeps deps);
  void Monitor();

  const CoordinatorOptions options_;
  CoordinatorDeps deps_;
  CoordinatorState state_;
  Dispatcher dispatcher_;
  JobManager jobs_;
  WorkerManager workers_;
  ReportManager reports_;
  std::thread monitor_;
  std::atomic<int64_t> last_pass_ms_{0};  // clock time of the monitor's last completed pass
  // Calls to workers, kCallThreads at a time; destroyed first (declared last), so that
  // every queued call has run before the state and the managers it may touch are gone.
  static constexpr int kCallThreads = 16;
  CallPool calls_{kCallThreads};
};

}  // namespace pipetrain::coordinator
