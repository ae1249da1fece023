// Hosts one assigned rank from start to end, on the stage's thread: checks what the job may
// read and write (data_roots.h) and that it runs on this worker's device, builds and runs the
// stage (runtime/job/launch/stage_run.h) on the Gloo data plane whose ranks meet in the
// coordinator's store, measures it (stage_metrics.h), reports each step (step_reporter.h,
// with what the rank has to say once: a checkpoint committed or failed, where it resumed
// from), saves its weights when the job asks, and reports the stage's end (retried while no
// answer comes). What it runs is the StageSlot's occupant: it installs the stage's stopper,
// activity and (rank 0) command queue there, marks the slot ending, then releases it.
//
// A failure inside the stage (an error, a LibTorch exception such as out of memory) fails
// the rank with its cause, reported in its stage end; never the worker. A rank told to stop
// reports the reason it was given. With the step commit (assignment.commit_steps) a rank
// whose run failed first hands its state off as a survivor (survivor_handoff.h); its stage
// end says what came of it. A rank whose assignment names the survivors' state
// (replica_state) starts from it, taken from this worker's hold or the holders', and reads
// no checkpoint unless that fails; its first step report says how.
//
// Thread-compatible: Run is called on one stage's thread at a time (the slot's).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "metrics/metrics.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "rpc/security.h"
#include "worker/coordinator_client.h"
#include "worker/held_state.h"
#include "worker/stage_slot.h"
#include "worker/survivor_handoff.h"

namespace pipetrain::worker {

struct StageHostOptions {
  std::string device = "cpu";           // this worker's: cpu, cuda or cuda:N
  std::string data_host = "127.0.0.1";  // the address its stage listens on for peers
  std::vector<std::string> data_roots;  // what a job may read (data_roots.h)
  std::string address;                  // its WorkerService's (the survivors' state: below)
  rpc::SecurityOptions security;        // for its calls to other workers
};

class StageHost {
 public:
  // Not owned, outliving the host: `metrics`, `slot` and `held` (the survivors' state this
  // worker holds: a survivor keeps its state there, and a rank of the next generation takes
  // its layers from there or from the other holders the assignment names,
  // replica_state_fetch.h).
  StageHost(StageHostOptions options, std::shared_ptr<CoordinatorClient> coordinator,
            metrics::Registry* metrics, StageSlot* slot, HeldStates* held);

  // Runs `assignment`'s rank to its end as `worker_id` and reports the end; the slot is free
  // when it returns.
  void Run(const v1::StageAssignment& assignment, const std::string& worker_id);

  // A stage's end is sent this many times at most while no answer comes (5 s each).
  static constexpr int kStageEndAttempts = 3;

 private:
  // Builds and runs the rank until it ends; its outcome (a failure names its cause). With
  // the step commit, what the rank did as a survivor goes to `survivor`.
  absl::Status RunStage(const v1::StageAssignment& assignment, const std::string& worker_id,
                        SurvivorOutcome& survivor);

  const StageHostOptions options_;
  const std::shared_ptr<CoordinatorClient> coordinator_;
  metrics::Registry* const metrics_;
  StageSlot* const slot_;
  HeldStates* const held_;
  std::string metrics_job_;  // whose series are in metrics_ (the stage's thread only)
};

}  // namespace pipetrain::worker
