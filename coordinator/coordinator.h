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
// Parts, each with one concern: everything about one job (job_controller.h: its record,
// run, step ledger, restart point, survivors and what they hold; this class hands it each
// event and carries out the effects it asks for, in Carry), a job's lifecycle as a pure
// state machine (job_machine.h, inside the controller), the checks of a step report
// (report_checks.h), the worker pool and its liveness (worker_pool.h), placement of queued
// jobs and recovery layouts (placement.h), calls to workers (worker_client.h), planning at
// submission (submission_planner.h), the scheduler's decisions (scheduler.h), the
// step-command relay (command_relay.h), the running generations' rendezvous stores
// (rendezvous_stores.h), the jobs and their queued writes (job_table.h), the durable store
// (job_store.h) and its write-behind (write_behind.h), time (runtime/base/clock.h). This
// class is the shell that owns the one lock, the worker pool and the monitor; its handlers
// are defined by service in coordinator.cc (the shell), coordinator_jobs.cc,
// coordinator_workers.cc, coordinator_reports.cc, coordinator_scheduling.cc and
// coordinator_survivors.cc. Everything it depends on is injected (CoordinatorDeps), so its
// rules are unit-tested with a fake clock, fake workers and a store that fails
// (tests/coordinator), no sockets and no sleeps.
//
// Persistence: store writes are made outside the lock that RPC handlers take. A change
// queues the job's latest record (and its events) under the lock; the thread that made it
// writes the queue after releasing the lock, in order. A submission is acknowledged only
// once its record is durable: if the write fails, the job is dropped and the caller told.
// A state a caller is shown (Get, List, WaitForChange) is in the store before the answer
// leaves: they write what is queued before they answer (progress from step reports, written at most once
// a second, may be ahead of the store; a state change never is).
//
// Thread-safe: one absl::Mutex (mu_) guards the state, each guarded field and each method
// that needs it says so (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED), and clang checks it
// (-Wthread-safety).
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/base/clock.h"
#include "coordinator/call_pool.h"
#include "coordinator/command_relay.h"
#include "coordinator/job_controller.h"
#include "coordinator/job_machine.h"
#include "coordinator/job_store.h"
#include "coordinator/job_table.h"
#include "coordinator/rendezvous_stores.h"
#include "coordinator/scheduler.h"
#include "coordinator/submission_planner.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_pool.h"
#include "coordinator/write_behind.h"
#include "rpc/security.h"
#include "pipetrain/v1/coordinator_service.pb.h"
#include "pipetrain/v1/job_service.pb.h"
#include "runtime/job/job_config.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::coordinator {

struct CoordinatorOptions {
  std::string db_path = "pipetrain-coordinator.db";
  absl::Duration heartbeat_interval = absl::Seconds(1);
  rpc::SecurityOptions security;         // token and TLS for its calls to workers
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

  // Stops the monitor thread (no worker is declared lost from then on): first thing on
  // SIGTERM, so that heartbeats refused while the server drains are not taken for lost
  // workers (the running jobs are then "interrupted by a coordinator restart" at the next
  // start, their true cause).
  void StopMonitor();

  // One pass of the monitor at the clock's time: workers silent for two heartbeat intervals
  // are lost (failing their jobs), held-back rank failures are decided, queued jobs placed.
  void Tick();

  // Whether the monitor has completed a pass (a tick and its writes) within
  // options.stall_limit of the clock's time: false while its state loop is blocked (a lock
  // held too long, a store write that hangs), so health checks can say NOT_SERVING. Always
  // true without the monitor thread. Thread-safe, takes no lock.
  bool StateLoopLive() const;

  // JobService. A spec with `stages: auto` is planned here with `model_profile_json` (the
  // model's profile, runtime/planner/profile_json.h) for the workers registered now (idle or
  // busy; their count, the smallest registered memory, the cores they share when all run on
  // one host); the job keeps the planned layout in its spec and the plan in `plan`.
  // InvalidArgument for a missing or bad profile, FailedPrecondition with no worker,
  // ResourceExhausted when no layout fits ("does not fit: needs X bytes on stage s, have Y").
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& model_profile_json = "");
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // Jobs oldest first, a page at a time: at most `page_size` (0: 100; at most 500) and about
  // kListPageBytes, after the job `page_token` names ("" from the first). The page's
  // next_page_token is "" after the last job; an invalid token is InvalidArgument.
  absl::StatusOr<v1::ListJobsResponse> List(int page_size = 0, const std::string& page_token = "");
  static constexpr size_t kListPageBytes = size_t{1} << 20;
  absl::StatusOr<v1::Job> Cancel(const std::string& id);
  // Waits until job `id` differs from `version` (or `deadline`); returns it and its version.
  absl::StatusOr<std::pair<v1::Job, int64_t>> WaitForChange(const std::string& id,
                                                            int64_t version,
                                                            absl::Time deadline);
  // At most kEventsPerCall events after `after_seq` (a caller wanting more asks again).
  absl::StatusOr<std::vector<v1::JobEvent>> Events(const std::string& id, int64_t after_seq);
  static constexpr int64_t kEventsPerCall = 1000;
  std::vector<v1::WorkerInfo> Workers();
  // The committed steps of job `id` after `after_step`, at most kStepsPerCall.
  absl::StatusOr<std::vector<StoredStep>> Steps(const std::string& id, int64_t after_step);
  static constexpr int64_t kStepsPerCall = 10000;
  // Passes a step command to the worker of rank 0 (it reaches every stage through the data
  // plane) and returns the boundary it takes effect at.
  absl::StatusOr<v1::SendCommandResponse> SendCommand(const v1::SendCommandRequest& request);

  // CoordinatorService. Registering gives a worker its own session (the response's
  // `session`); every other call names the session it came with (rpc::WorkerSession), and
  // may speak only for that worker and for the ranks assigned to it: an unknown session is
  // NotFound (the worker registers again), another worker's id or a rank or job not assigned
  // to it is PermissionDenied, and nothing is changed.
  // A worker registering from the address of one already known replaces it (a worker that
  // restarted on a fixed port): the old entry's rank, if any, is lost.
  // `peer`: where the call came from, as gRPC names it ("ipv4:10.0.0.2:5555"; "" unknown).
  // An address that cannot be reached is refused: a wildcard (InvalidArgument), or a
  // loopback address registered from another host (FailedPrecondition); both name the
  // worker's flags that fix it.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest& request,
                                                      const std::string& peer = "");
  // A worker stopping on purpose leaves the pool (a rank it still ran is lost).
  absl::Status Deregister(const std::string& session, const v1::DeregisterWorkerRequest& request);
  // The answer names the jobs whose survivors' state the worker should keep holding.
  absl::Status Heartbeat(const std::string& session, const v1::HeartbeatRequest& request,
                         v1::HeartbeatResponse* response = nullptr);
  // The worker is draining (CoordinatorService.DrainWorker): no rank is given to it any more;
  // if it runs a rank of a running job with restarts left, a checkpoint is scheduled at the
  // job's earliest boundary N (through rank 0's worker, as SendCommand does), and once the
  // checkpoint before N is the job's restart point the job restarts from it (its generation
  // ends, so this worker's stage is stopped). Returns N, or 0 when there is nothing to wait
  // for (the worker stops at once).
  absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(const std::string& session,
                                                      const v1::DrainWorkerRequest& request);
  // Before the coordinator stops (SIGTERM): every running job with restarts left gets a
  // checkpoint at its earliest boundary; waits until each is the job's restart point (or
  // the job ended), at most `limit`. A restarted coordinator resumes the jobs from there.
  // Returns how many jobs got one in time.
  int CheckpointRunningJobs(absl::Duration limit);
  // A batch is checked whole before any of it is applied: each report is its rank's next step
  // (one already counted, resent after a lost reply, is skipped) and below the job's steps,
  // with finite, non-negative times; otherwise InvalidArgument and the job is untouched.
  absl::StatusOr<v1::ReportResponse> ReportSteps(const std::string& session,
                                                 const v1::StepReports& reports);
  absl::StatusOr<v1::ReportResponse> ReportStageEnd(const std::string& session,
                                                    const v1::StageEnd& end);
  // A rank of a generation with the step commit whose run failed says where its weights
  // stand (job_controller.h Stopped): the first report of a rank ends it for the job machine
  // (as a failed StageEnd would; its worker stays busy until its StageEnd), and the
  // generation's SurvivorRound (survivor_round.h) answers: WAIT until every rank is accounted
  // for (or three heartbeat intervals after the generation ended), then GO_ON or ABANDON.
  // A job not running, another generation's rank, or a job without the commit: ABANDON.
  absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const std::string& session,
                                                        const v1::StoppedRank& stopped);
  // The key-value store the ranks of running job `job_id` meet in (the KV RPCs): only for a
  // worker that runs one of its ranks, of the job's current `generation` (a rank of an ended
  // one is refused: FailedPrecondition). Bounded as rendezvous_stores.h says.
  absl::StatusOr<std::shared_ptr<rendezvous::KeyValueStore>> Rendezvous(
      const std::string& session, const std::string& job_id, int generation);
  static constexpr size_t kKvValueBytes = RendezvousStores::kValueBytes;
  static constexpr size_t kKvKeyBytes = RendezvousStores::kKeyBytes;
  static constexpr int kMaxWorkerCores = 65536;
  // Worker numbers are reserved from the store this many at a time (NextWorkerNumber).
  static constexpr int64_t kWorkerNumberBlock = 64;
  // A worker's lease, in heartbeat intervals: one that has had no heartbeat answered for this
  // long stops its stage (it was taken for lost after two intervals without a heartbeat).
  static constexpr int kLeaseIntervals = 3;

  // What the coordinator's /metrics shows (coordinator_metrics.h), read in one pass under
  // its lock.
  struct MetricsSnapshot {
    std::map<std::string, int> jobs_by_state;     // "queued", "running", ... (every state)
    std::map<std::string, int> workers_by_state;  // "idle", "busy", ... (StateName, every state)
    struct RunningJob {
      std::string id;
      int64_t step = -1;  // last step every rank finished
      double tokens_per_s = 0;
      std::optional<double> loss;  // of the last step, from the last stage
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
    // Step commands asked for, by (command, outcome): outcome "scheduled" or the refusal's
    // status code ("FAILED_PRECONDITION", ...).
    std::map<std::pair<std::string, std::string>, int64_t> step_commands;
  };
  MetricsSnapshot Metrics();

 private:
  absl::StatusOr<v1::SendCommandResponse> SendCommandUncounted(
      const v1::SendCommandRequest& request);
  // List's page of jobs after submission order `after`, at most `limit`.
  v1::ListJobsResponse ListPage(int64_t after, int limit) ABSL_LOCKS_EXCLUDED(mu_);
  Coordinator(CoordinatorOptions options, CoordinatorDeps deps);
  absl::Status Load();
  // REQUIRES: mu_ NOT held. Writes what the job table queued (write_behind.h).
  absl::Status FlushWrites() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `body` under mu_, then writes what it queued to the store (outside the lock).
  // (`body` is a lambda annotated ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_).)
  template <typename F>
  auto LockedThenFlush(F body) ABSL_LOCKS_EXCLUDED(mu_) {
    auto result = [&] {
      absl::MutexLock lock(&mu_);
      return body();
    }();
    (void)FlushWrites();
    return result;
  }
  // REQUIRES: mu_ held.
  void TickLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool's lost-worker listener (every loss comes here, under mu_): says so, and fails
  // the running job of the rank the worker ran ("<id> (<address>) running stage S <why>").
  void OnWorkerLost(const WorkerPool::Lost& lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AssignRank(const std::string& job_id, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. The assignment of `rank` to `worker_id` failed with `error`: the rank
  // goes to another idle worker (the unreachable one is lost), or its job fails.
  void AssignmentFailed(const std::string& job_id, int rank, const std::string& worker_id,
                        const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t NowMs() const;
  // What each job's controller is given (the clock, the heartbeat interval).
  JobController::Settings JobSettings() const;
  // REQUIRES: mu_ held. Carries out what the job's controller asked for since its last
  // effects were taken (job_controller.h JobEffects): its rendezvous store, the survivors'
  // state it holds, stops sent to workers off the lock, its events, steps and record queued
  // for the store.
  void Carry(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. A job's checkpoints never share a directory with another's: without
  // checkpoint.dir, job `id` gets checkpoints/<id> (set in `spec` and `config`); a directory
  // a queued or running job uses is refused (FailedPrecondition naming that job), and so is
  // resume_from: latest without a directory (InvalidArgument: nothing is in a new one).
  absl::Status PlaceCheckpointDirLocked(const std::string& id, v1::JobSpec& spec,
                                        job::JobConfig& config) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. The jobs whose held state `worker_id` holds and should keep
  // (HeartbeatResponse); forgets held states no longer needed (the job committed their step,
  // or ended).
  std::vector<std::string> HeldStateJobsOf(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. What a generation's placement asks of the pool: a worker's host, the
  // address of a worker not lost ("" otherwise).
  std::function<std::string(const std::string&)> WorkerHosts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::function<std::string(const std::string&)> LiveWorkerAddresses()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. The job's controller started its next generation: its effects
  // carried out, each rank's worker taken from the pool and sent its assignment.
  void AssignGeneration(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. Carries out the scheduler's plan for each recovering job (see
  // Recovery above; scheduler.h PlanRecovery): its next generation started, its wait told in
  // its status, or its end; true while any holds the idle workers (queued jobs wait then).
  bool PlaceRecovering() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. Starts every queued job that fits in the idle workers.
  void Schedule() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Monitor();
  // REQUIRES: mu_ held. The worker that holds `session`, if it claims to be `worker_id`
  // (any id if empty).
  absl::StatusOr<WorkerPool::Worker*> CallerLocked(const std::string& session,
                                                   const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. Which reports of a batch to apply (resent ones left out), or why the
  // batch is refused.
  absl::StatusOr<std::vector<const v1::StepReport*>> CheckReportsLocked(
      const std::string& session, const v1::StepReports& reports)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held.
  absl::StatusOr<v1::ReportResponse> ReportStepLocked(const v1::StepReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held.
  absl::StatusOr<v1::ReportResponse> StageEndLocked(const v1::StageEnd& end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `call` for the call pool (RPCs to workers never run under mu_).
  void Later(std::function<void()> call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorOptions options_;
  CoordinatorDeps deps_;
  SubmissionPlanner planner_;  // `stages: auto` at submission; never under mu_
  const Scheduler scheduler_;  // where jobs run (pure decisions; applied under mu_)
  WriteBehind writes_;         // queued under mu_, written by FlushWrites outside it
  // The one lock of the coordinator's state; `changed_` is signalled on every change of a
  // job (WaitForChange).
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  JobTable jobs_ ABSL_GUARDED_BY(mu_);  // the jobs; their changes queued into writes_
  // The jobs whose controller holds survivors' state (a heartbeat looks only at these).
  std::set<std::string> holding_jobs_ ABSL_GUARDED_BY(mu_);
  WorkerPool pool_ ABSL_GUARDED_BY(mu_);
  RendezvousStores rendezvous_ ABSL_GUARDED_BY(mu_);  // of the running generations
  int64_t next_worker_ ABSL_GUARDED_BY(mu_) = 0;
  // Worker numbers, reserved from the store kWorkerNumberBlock at a time (one durable write
  // per block, not per registration: thousands of workers register within seconds); a
  // restart starts a new block, so a number is never given twice.
  absl::StatusOr<int64_t> NextWorkerNumber() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Mutex numbers_mu_;
  int64_t number_next_ ABSL_GUARDED_BY(numbers_mu_) = 1;
  int64_t number_end_ ABSL_GUARDED_BY(numbers_mu_) = 0;
  int64_t workers_lost_silent_ ABSL_GUARDED_BY(mu_) = 0;
  CommandRelay commands_ ABSL_GUARDED_BY(mu_);  // step commands: counts and reports tallied
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;
  std::atomic<int64_t> last_pass_ms_{0};  // clock time of the monitor's last completed pass
  // Calls to workers, kCallThreads at a time; destroyed first (declared last), so that
  // every queued call has run before the state it may touch is gone.
  static constexpr int kCallThreads = 16;
  CallPool calls_{kCallThreads};
};

}  // namespace pipetrain::coordinator
