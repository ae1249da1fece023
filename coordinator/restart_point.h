// Where a running job restarts from after a fault, as one generation moves it: a checkpoint a
// rank reports committing (StepReport.checkpoint_committed, the checkpoint before step N)
// becomes the job's restart point once every step before N is committed here (the step
// ledger's rows: a restart must find every step before the checkpoint it resumes from). The
// final checkpoint (after the last step) is no restart point: a generation resumed there
// would have nothing left to run, so it is only announced. A drain (a worker stopping on
// purpose) waits here for its checkpoint: once the restart point reaches the drain's
// boundary, the generation ends so that the job goes on without that worker.
//
//   Reported(N, dir)            -> pending N (only one newer than the restart point counts)
//   Committed(through >= N - 1) -> restart point N, and a drained generation ends if N >= D
//   Committed(..), N >= steps   -> the final checkpoint announced, nothing pending
//   Drain(worker, D)            -> the generation ends once the restart point is D or later
//
// Pure: no clock, no I/O; the caller (the coordinator, under its lock) carries out what a
// Decision says. Thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace pipetrain::coordinator {

struct CommittedCheckpoint {
  int64_t step = 0;  // the checkpoint before this step
  std::string dir;
};

class RestartPoint {
 public:
  // A new generation: nothing reported, no drain.
  void Reset() { *this = RestartPoint(); }

  // A rank committed the checkpoint before `step` in `dir`. One not past `restart_point` (the
  // job's now) changes nothing; another replaces the pending one (ranks report
  // their checkpoints in step order).
  void Reported(int64_t step, std::string dir, int64_t restart_point);

  struct Decision {
    std::optional<CommittedCheckpoint> restart_point;  // the job's restart point moves here
    std::optional<CommittedCheckpoint> final_one;      // the final checkpoint, committed
    // The drained worker's cause, once its checkpoint is the restart point: the generation
    // ends (a Fault) and the job restarts from it without that worker.
    std::optional<std::string> drained;
  };
  // Every step up to `committed_through` is committed; the job's restart point is
  // `restart_point` and it runs `job_steps` steps.
  Decision Committed(int64_t committed_through, int64_t restart_point, int64_t job_steps);

  // Worker `worker_id` (at `address`) drains: the generation ends once the restart point is
  // the checkpoint before `step` or later. The first drain of a generation counts.
  void Drain(std::string worker_id, std::string address, int64_t step);
  // The drain's boundary, 0 when no worker drains.
  int64_t drain_step() const { return drain_step_; }

 private:
  CommittedCheckpoint pending_;  // step 0: none
  std::string draining_worker_, draining_address_;
  int64_t drain_step_ = 0;
};

}  // namespace pipetrain::coordinator
