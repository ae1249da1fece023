// One (stage, replica) of a job, run by whoever hosts it: a stage process of `pipetrain run
// --launch processes`, or a worker daemon given an assignment by the coordinator.
//
// RunStage builds the plan from the JobSpec (identically on every rank), joins the Gloo
// data plane through `store` (every rank of the job meets there), runs the stage's schedule
// and returns its measurements and final weights; its host listens (StageListener) and may
// stop it from any thread (StageHandle). It writes the job's checkpoints with the
// other ranks and resumes from one (runtime/checkpoint/job_checkpoints.h); in the store it uses
// only the transport's rendezvous keys and those of checkpointing (ckpt/, resume/) and leaving
// (exit/).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/job_checkpoints.h"
#include "runtime/control/step_commands.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/stage_handle.h"
#include "runtime/job/launch/stopped_rank.h"
#include "runtime/job/report/report.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/transport.h"

namespace pipetrain::job {

// What a rank's host hears while the rank runs, each call on the rank's thread in the order
// of a run (Resumed, Built, then ActionDone, Checkpointed and StepDone as the schedule goes,
// Stopped if it fails). Every method has a default that does nothing. None may wait without a
// deadline.
class StageListener {
 public:
  virtual ~StageListener() = default;
  // Rank 0, when it resumes from a checkpoint: its directory and each newer checkpoint
  // passed over to get there, with why (before the first step).
  virtual void Resumed(const std::string& /*dir*/,
                       const std::vector<std::string>& /*passed_over*/) {}
  // The rank's layers are built: one version's parameter bytes and the layers it runs (those
  // of each model stage it holds, in model order).
  virtual void Built(int64_t /*parameter_bytes*/,
                     const std::vector<model::LayerRange>& /*layers*/) {}
  // After every action (StageConfig::on_action).
  virtual void ActionDone(const executor::ActionRecord& /*record*/) {}
  // Replica 0's ranks, after writing their part of the checkpoint before mini-batch `step`
  // (runtime/checkpoint/job_checkpoints.h): the rank that committed it gets the step-N
  // directory (absolute) in `result`; a failed checkpoint costs only itself.
  virtual void Checkpointed(int64_t /*step*/,
                            const checkpoint::SharedCheckpointResult& /*result*/) {}
  // After every finished step (after Checkpointed for its boundary).
  virtual void StepDone(const executor::StepRecord& /*step*/) {}
  // The run failed, with the rank's state, before that is destroyed and before its transport
  // goes (its peers see its connections close once this returns): a host going on from the
  // survivors of a fault reports the state, waits for the plan, applies the held update and
  // writes its layers (DeliverStoppedRank).
  virtual void Stopped(const StoppedRank& /*rank*/) {}
};

// How a host runs a rank. Plain data; the pointers are not owned and outlive the run.
struct StageRunOptions {
  std::string host = "127.0.0.1";  // address this rank listens on for its peers
  // The GPU of a device: cuda job (job/device.h); -1: the rank's (round-robin).
  int device_index = -1;
  // Rank 0 only: where step commands for the job arrive (runtime/control).
  std::shared_ptr<control::StepCommandQueue> commands;
  StageListener* listener = nullptr;  // none: nobody listens
  StageHandle* handle = nullptr;      // none: the rank is stopped only through its store
  // Where the survivors of a fault hold the state the job goes on from, in memory: given the
  // layers the rank holds (RankLayers), their state at step `replica_state_step`, in order.
  // When set, the rank starts from what it returns without reading a checkpoint (Resumed is
  // not heard); if it fails, the rank reads its layers from the checkpoint resume_from names
  // (on its own: the other ranks may not read it) and says why on stderr.
  std::function<absl::StatusOr<std::vector<checkpoint::LayerState>>(
      const std::vector<model::LayerRange>& layers)>
      replica_state;
  int64_t replica_state_step = -1;
  // Wraps the stage's transport once it is up (tests: fault injection).
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>
      wrap_transport;
  Generation generation;  // the coordinator's StageAssignment: generation, commit_steps, ...
};

// The payload RunStage's error carries when another rank of the job failed before it (its
// value: that rank): this rank's failure is most likely a consequence, and its message leads
// with the first rank's error.
inline constexpr char kFailedAfterPeerPayload[] = "pipetrain.dev/failed-after-peer";

// rank = replica * stages + stage. Sets the intra-op thread count for the stage.
absl::StatusOr<StageOutcome> RunStage(const JobSpec& config, int rank,
                                      std::shared_ptr<rendezvous::KeyValueStore> store,
                                      const StageRunOptions& options = {});

// A stopped rank's layers (StoppedRank::model_stages, as they stand) written as those of the
// job's checkpoint before mini-batch `step` through `store`
// (checkpoint::DeliverThroughStore for each model stage it holds): what a survivor that
// supplies its place does. The first error, and the step-N directory if this rank committed
// it. Call it from StageListener::Stopped (the state is valid only there). `generation`: the
// rank's (Generation::number); the survivors write under their own tag
// (checkpoint::CheckpointWriters), apart from the generation's ranks at their boundaries.
checkpoint::SharedCheckpointResult DeliverStoppedRank(rendezvous::KeyValueStore& store,
                                                      const JobSpec& config,
                                                      const StoppedRank& rank, int64_t step,
                                                      int64_t generation);

// A stopped rank's layers as they stand, each as the bytes of its checkpoint file
// (checkpoint::SerializeLayerState), by global layer index: what a survivor holds for the
// next generation. Call it from StageListener::Stopped.
std::map<int, std::string> StoppedRankLayerBytes(const StoppedRank& rank);

// <dir>/stage<rank>.pt (parameters then buffers, torch::save of a tensor list) and
// <dir>/stage<rank>.json (measurements and the parameter count).
absl::Status WriteStageOutcome(const std::string& dir, int rank, const StageOutcome& outcome);
absl::StatusOr<StageOutcome> ReadStageOutcome(const std::string& dir, int rank);

// The job's weights_dir, if set, exists (made if missing) and takes a file: checked before a
// rank builds anything, so a job that could not save its weights fails at once.
absl::Status CheckWeightsDir(const JobSpec& config);

// The job's weights_dir, if set: the rank's outcome written there as above (the directory
// made if missing), by whoever ran the rank (a thread, a stage process, a worker).
absl::Status SaveStageWeights(const JobSpec& config, int rank, const StageOutcome& outcome);

}  // namespace pipetrain::job
