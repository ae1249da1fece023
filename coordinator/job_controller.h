// One job, everything about it: its record (v1::Job) and spec, its run (the job machine,
// job_machine.h), which worker runs each rank, the generation's step ledger, the step
// commands taking effect, where it restarts from as checkpoints commit and a drain waits
// (restart_point.h), the round of its survivors after a fault (survivor_round.h) and the
// state they hold for the next generation (survivor_hold.h).
//
// Events come in (a step report, a stage's end, a stopped rank's report, a worker lost, a
// command, a placement, the monitor's tick) and effects go out: after each call,
// TakeEffects() hands the coordinator what to carry out — the job's events and committed
// step rows for the store, whether its record is written now or with progress, the stages
// to stop, its rendezvous store opened afresh or closed, and whether it holds survivors'
// state. The controller never calls a worker, the store or the pool: what it needs of them
// comes in as arguments (a worker's address, its host), so each of its protocols is tested
// with an event in and effects out (tests/coordinator/job_controller_test.cc), no sockets,
// no sleeps. The coordinator's shared state (coordinator_state.h) holds the controllers
// (job_table.h) under its lock and carries out their effects (Carry).
//
// Not thread-safe: the coordinator calls it under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/job_machine.h"
#include "coordinator/job_store.h"
#include "coordinator/restart_point.h"
#include "coordinator/scheduler.h"
#include "coordinator/step_ledger.h"
#include "coordinator/survivor_hold.h"
#include "coordinator/survivor_round.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "runtime/base/clock.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::coordinator {

// "stage 1" or "stage 1 replica 0", for messages.
std::string RankName(const v1::Job& job, int rank);

// What one call into a job's controller asks the coordinator to do, in this order.
struct JobEffects {
  std::vector<std::string> events;  // the job's events, in order
  std::vector<StoredStep> steps;    // rows of steps it committed, in order
  struct Stop {                     // tell this worker to stop its stage of the job
    std::string worker_id;
    int64_t generation = 0;
    std::string reason;
  };
  std::vector<Stop> stops;
  // Its rendezvous store (rendezvous_stores.h): opened afresh or closed (the last asked).
  enum class Store { kUnchanged, kOpen, kClose };
  Store rendezvous = Store::kUnchanged;
  // Its record changed: written now, or as progress (at most once a second; job_table.h).
  enum class Write { kNone, kProgress, kNow };
  Write write = Write::kNone;
  // It began holding survivors' state in workers' memory (KeepsHeldState says until when).
  bool began_holding = false;
};

class JobController {
 public:
  static constexpr size_t kMaxErrorBytes = 4096;  // of a stage's failure, as kept and shown
  // Ranks whose workers a job's "running: ..." event names (the rest are counted).
  static constexpr int kRanksNamed = 16;
  // A survivors' round decides once this many heartbeat intervals passed since the
  // generation ended, whatever has not reported by then (a hung rank) passed over.
  static constexpr int kRoundIntervals = 3;
  // The longest a survivor holds its state for the next generation when no heartbeat
  // answer lets it go first (the coordinator out of reach).
  static constexpr absl::Duration kLongestHold = absl::Minutes(10);

  struct Settings {
    std::shared_ptr<Clock> clock;  // the time of everything it records
    absl::Duration heartbeat_interval = absl::Seconds(1);
  };

  // A job submitted: `job` its record as queued (id, spec, layout, steps), `config` its spec
  // with defaults applied.
  JobController(Settings settings, v1::Job job, job::JobSpec config);
  // A job as a starting coordinator finds it in its store (`config`: its spec read again,
  // an error for a spec this version no longer takes). A job that ran then is restarted
  // (a Fault: the coordinator restarted) if it has restarts left, else marked failed
  // ("interrupted by a coordinator restart"): TakeEffects() says so.
  static JobController FromRecord(Settings settings, v1::Job job,
                                  const absl::StatusOr<job::JobSpec>& config);

  // What the calls since the last TakeEffects() asked for; the controller then has none.
  JobEffects TakeEffects();

  // ---- What it is (read by the coordinator to schedule, check reports and show it).
  const v1::Job& job() const { return job_; }
  const std::string& id() const { return job_.id(); }
  const job::JobSpec& config() const { return config_; }
  const JobRun& run() const { return run_; }
  Phase phase() const { return run_.phase; }
  // The worker of each rank of its current (or last) generation.
  const std::vector<std::string>& rank_worker() const { return rank_worker_; }
  const StepLedger& ledger() const { return ledger_; }
  const std::optional<SurvivorHold>& held_state() const { return held_state_; }
  // Kept until a restart gives the job its next generation (phase kRecovering).
  absl::Time recovering_since() const { return recovering_since_; }
  absl::Time lost_ranks_stop_by() const { return lost_ranks_stop_by_; }
  int64_t drain_step() const { return restart_point_.drain_step(); }
  // Whether a report of the generation that ended, from `worker_id` running `rank`, still
  // counts (ReportLateStep): its survivors have not decided yet.
  bool TakesLateReport(int rank, int64_t generation, const std::string& worker_id) const;
  // The assignment of `rank` of its current generation.
  v1::StageAssignment AssignmentFor(int rank) const;

  // ---- Events in; each leaves its effects for TakeEffects().
  // An event of its lifecycle (job_machine.h), its commands carried out on the record.
  void Apply(const JobEvent& event);
  // Its next generation runs: rank r on placed_workers[r] (reordered so that survivors run
  // their own stages again where they can; `host_of` a worker's host), running `run_spec`
  // from `start_step` (-1: its resume_from decides). `live_address`: the address of a worker
  // not lost, "" otherwise (who can hand over held state). The coordinator then assigns
  // each rank (rank_worker(), AssignmentFor).
  void StartGeneration(const std::vector<std::string>& placed_workers,
                       const std::function<std::string(const std::string&)>& host_of,
                       v1::JobSpec run_spec, int64_t start_step,
                       const std::function<std::string(const std::string&)>& live_address);
  // A recovering job's next generation is placed (scheduler.h StartGeneration): its layout
  // and recovery recorded, then StartGeneration.
  void Recover(const coordinator::StartGeneration& start,
               const std::function<std::string(const std::string&)>& host_of,
               const std::function<std::string(const std::string&)>& live_address);
  // Why it waits in the queue (the scheduler's words) or for its next generation.
  void WaitsInQueue(const std::string& reason);
  void WaitsToRecover(const std::string& why);
  // A step report of its running generation, checked (report_checks.h, in order).
  void ReportStep(const v1::StepReport& report);
  // A report of the generation that ended, while its survivors decide (TakesLateReport):
  // counted (its loss, its commit), nothing else.
  void ReportLateStep(const v1::StepReport& report);
  // A rank of it ended (its error at most kMaxErrorBytes).
  void StageEnd(const v1::StageEnd& end);
  // A rank of a generation with the step commit stopped and says where it stands (the
  // coordinator's ReportStopped, checked there to be the caller's rank of this generation).
  // The instruction it gets; InvalidArgument for a report that cannot be.
  absl::StatusOr<v1::SurvivorInstruction> Stopped(const v1::StoppedRank& stopped);
  // The worker of `rank` (of `generation`, 0: unknown) was lost after `silent` without a
  // heartbeat; `what`: "worker-3 (host:port)", `why`: how it was lost.
  void WorkerLost(int rank, int64_t generation, absl::Duration silent, const std::string& what,
                  const std::string& why, absl::Duration lease);
  // The monitor's pass: a survivors' round past its deadline decides without the ranks that
  // did not report.
  void Tick();
  // A step command was scheduled at `boundary` (a stop is the job machine's too).
  void CommandScheduled(v1::StepCommand command, const std::string& name, int64_t boundary);
  // A worker running a rank of it drains: the checkpoint at `boundary` is where the job
  // restarts from without it (restart_point.h Drain). `address` names it.
  void Drain(const std::string& worker_id, const std::string& address, int64_t boundary);
  // The assignment of `rank` failed: the attempts so far for it, counting this one.
  int AssignmentAttempt(int rank) { return ++assign_attempts_[rank]; }
  // The rank moves to `worker_id` after `failed` (the failed assignment's words).
  void MoveRank(int rank, const std::string& worker_id, const std::string& failed);
  // A heartbeat's activity of `rank` on `worker_id` ("computing", "waiting for stage 2");
  // true if it changed what the job shows (the coordinator wakes its watchers).
  bool Activity(int rank, const std::string& worker_id, const std::string& action,
                const std::string& waiting_for);
  // Whether its held state should still be kept (until the job committed its step again,
  // or ended); drops it when not.
  bool KeepsHeldState();

 private:
  explicit JobController(Settings settings) : settings_(std::move(settings)) {}
  int64_t NowMs() const;
  // An event of the job.
  void Say(const std::string& text);
  // Tokens (or samples) a step of it trains on, for its throughput.
  static int64_t TokensPerStep(const v1::Job& job, const job::JobSpec& config);
  void Changed(bool progress_only = false);
  void Stop(const std::vector<int>& ranks, const std::string& reason);
  // The job machine's commands, on the record.
  void RecordRecovery(const BeginRecovery& recovery);
  void RecordEnd(const std::string& message);
  void ReturnToQueue(const std::string& why);
  void CommitSteps(const std::vector<StepLedger::CommittedStep>& steps);
  // The generation's survivors' round, begun if it has none and the job commits its steps;
  // null if not.
  SurvivorRound* Survivors();
  void SurvivorGone(int rank);
  // Decides the round of a recovering job once every rank is accounted for or its deadline
  // passed: with a plan, the job's store starts afresh for the survivors' writes.
  void MaybeDecideSurvivors();
  // A survivor's StageEnd: the survivors' checkpoint its writer committed becomes the job's
  // restart point (the steps before it committed), or its failure is said.
  void SurvivorStageEnd(const v1::StageEnd& end);
  // The replica state a generation starting at `start_step` takes: the held state at that
  // step, each layer's holders not lost; empty if none, or some layer has no holder left.
  v1::ReplicaState ReplicaStateFor(
      int64_t start_step, const std::function<std::string(const std::string&)>& live_address);

  Settings settings_;
  JobEffects effects_;
  v1::Job job_;
  job::JobSpec config_;
  JobRun run_;  // its lifecycle; job_.state, restarts, generation mirror it
  std::vector<std::string> rank_worker_;
  StepLedger ledger_;  // the generation's steps: per rank, committed, losses, throughput
  std::vector<int> assign_attempts_;  // assignments tried per rank
  int64_t tokens_per_step_ = 0;
  std::string requeued_because_;  // why a job that ran waits in the queue again
  v1::JobSpec run_spec_;          // what its ranks run: the spec with the layout and resume point
  absl::Time recovering_since_;   // when its last generation ended (phase kRecovering)
  // Until when a rank of this generation on a worker taken for lost (silent, maybe only cut
  // off) may still run: its lease from its last heartbeat, and an interval to stop. The next
  // generation is not placed before (no two generations' ranks at once).
  absl::Time lost_ranks_stop_by_ = absl::InfinitePast();
  RestartPoint restart_point_;
  // The generation runs with the step commit (StageAssignment.commit_steps): after a rank
  // failed or was lost, its survivors report, and the round decides where the job goes on.
  bool commit_steps_ = false;
  std::optional<SurvivorRound> survivors_;  // this generation's round, once one began
  // The state the survivors of its last round hold in their workers' memory, which a
  // generation starting at its step takes instead of reading the checkpoint.
  std::optional<SurvivorHold> held_state_;
  v1::ReplicaState replica_state_;  // what the running generation's assignments say of it
  // The steps whose update was skipped (a non-finite loss or gradient), as this coordinator
  // process learnt of them: a step run again after a restart counts once, and the steps
  // skipped in a row before a generation's first count toward its nonfinite_limit.
  std::set<int64_t> skipped_steps_;
  // Step commands' reports of the running generation: boundary -> ranks that reported
  // commands taking effect there (an event once every rank has).
  std::map<int64_t, int> commands_reported_;
};

// How many of the steps right before `step` are in `skipped`, in a row.
int SkippedInARowBefore(const std::set<int64_t>& skipped, int64_t step);

}  // namespace pipetrain::coordinator
