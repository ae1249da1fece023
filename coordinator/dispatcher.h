// Where jobs run, carried out: the scheduler's decisions (scheduler.h: queued jobs in
// submission order with backfill, recovering jobs first, an assignment's retry) handed to
// the jobs' controllers and applied to the worker pool, each rank's assignment sent off the
// lock; and the monitor's pass over the jobs (held-back failures decided once the peers'
// heartbeats say they are alive, survivors' rounds past their deadline decided).
//
// Thread-compatible: every method runs under the coordinator's lock (state.mu), which the
// public ones assert (the other managers call them holding it) and clang checks within.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/scheduler.h"

namespace pipetrain::coordinator {

class Dispatcher {
 public:
  // `state` (borrowed) outlives this.
  explicit Dispatcher(CoordinatorState& state);

  // Places what can run now: each recovering job's next generation (or its wait, or its
  // end), then, unless a recovering job holds the idle workers, every queued job that fits.
  void Schedule();
  // The monitor's pass over the jobs at the clock's time, then Schedule.
  void Tick();

 private:
  // Carries out the scheduler's plan for each recovering job (its next generation started,
  // its wait told in its status, or its end); true while any holds the idle workers.
  bool PlaceRecovering() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The job's controller started its next generation: its effects carried out, each rank's
  // worker taken from the pool and sent its assignment.
  void AssignGeneration(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  void AssignRank(const std::string& job_id, int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The assignment of `rank` to `worker_id` failed with `error`: the rank goes to another
  // idle worker (the unreachable one is lost), or its job waits in the queue or restarts.
  void AssignmentFailed(const std::string& job_id, int rank, const std::string& worker_id,
                        const absl::Status& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // What a generation's placement asks of the pool: a worker's host, the address of a
  // worker not lost ("" otherwise). Called under the lock, as the controller runs.
  std::function<std::string(const std::string&)> WorkerHosts()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  std::function<std::string(const std::string&)> LiveWorkerAddresses()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  CoordinatorState& state_;
  const Scheduler scheduler_;  // pure decisions
};

}  // namespace pipetrain::coordinator
