// A job's checkpoints, as the runtime's hosts write and resume them (the format and the
// directory protocol: the rest of runtime/checkpoint, docs/checkpoints.md). Every launch
// mode uses it: stages as threads (CheckpointSink), and ranks in processes of their own or
// worker daemons (through their job's key-value store).
//
// Writing: at a checkpoint boundary N every stage holds W(N) and its optimizer state (2BW
// drains and switches there). The stages of replica 0 (the replicas hold the same weights)
// each write their layers' files into DIR/step-N.tmp/; the last of them to finish writes the
// manifest and commits. A failed write aborts that checkpoint only: `latest` and the earlier
// ones stay, and the error is returned to the stage that saw it (the job goes on).
//
// Ranks in separate processes (stage processes, worker daemons; the checkpoint directory on a
// file system they share) do the same through their job's key-value store: each writes its
// layers into DIR/step-N[.TAG].tmp/, publishes their entries (or its error) under
// ckpt[-TAG]/N/<stage>, and adds 1 to ckpt[-TAG]/N/count; the rank that brings it to the stage
// count commits. TAG names who delivers (CheckpointWriters): ranks of different generations,
// or a rank cut off from the job and the survivors that write in its place, never write into
// one directory nor count into one commit.
//
// Resuming: the checkpoint named by resume_from is found and checked file by file
// (FindCheckpoint, falling back past a corrupt one), then against the job: the
// same model, data, dtype, seed and optimizer, and the same global batch (any stages and
// replicas: w x m x b equal), and a step before the job's last. Each stage then reads only
// its own layers' files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/plan.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::checkpoint {

// Thread-safe: the stages of one process deliver concurrently.
class CheckpointSink {
 public:
  CheckpointSink(const job::JobSpec& config, const job::JobPlan& plan);

  // Model stage `stage` (of replica 0) at boundary `step`: writes its layers, and commits the
  // checkpoint if it is the last stage to deliver (then says so on stderr: its directory,
  // size and the time from the first stage's delivery to the commit). The write's error, if any
  // (also when an earlier stage's write failed the same checkpoint: the first error).
  absl::Status Deliver(int64_t step, int stage, const weights::WeightStore& weights);

  // Checkpoints committed, and failed, so far.
  int committed() const;
  int failed() const;

 private:
  struct Pending {
    std::unique_ptr<CheckpointWriter> writer;
    std::vector<LayerFile> files;
    int delivered = 0;
    absl::Status error;
    absl::Time begun;  // the first stage's delivery
  };
  const job::JobSpec& config_;
  const job::JobPlan& plan_;
  mutable std::mutex mu_;
  std::map<int64_t, Pending> pending_;
  int committed_ = 0, failed_ = 0;
};

// What one rank's delivery through the store came to.
struct SharedCheckpointResult {
  absl::Status status;    // its own write's, or (for the committer) the checkpoint's
  std::string committed;  // the step-N directory, if this rank committed it
};

// Who delivers a checkpoint through a store. Stage processes without daemons: generation 0
// (untagged, step-N.tmp). Under the daemons: the generation's ranks at their checkpoint
// boundaries ("gen-G"), or the survivors of one of its faults writing the state the job goes
// on from ("gen-G-survivors").
struct CheckpointWriters {
  int64_t generation = 0;  // the coordinator's (StageAssignment.generation)
  bool survivors = false;
  std::string Tag() const;  // "", "gen-G", "gen-G-survivors"
};

// Stage `stage` of replica 0, in its own process, at boundary `step`: writes its layers and
// takes part in the commit as described above (the committer says so on stderr, as
// CheckpointSink does, timing its own write and the commit). Waits on the store only for the
// entries of stages that have counted themselves in already (so never for a slower stage).
SharedCheckpointResult DeliverThroughStore(rendezvous::KeyValueStore& store,
                                           const job::JobSpec& config, const job::JobPlan& plan,
                                           int64_t step, int stage,
                                           const weights::WeightStore& weights,
                                           const CheckpointWriters& writers = {});

// The checkpoint the job resumes from, checked against it; nullopt when resume_from is
// empty. `skipped` (newer checkpoints passed over, each with why) is in the result.
absl::StatusOr<std::optional<FoundCheckpoint>> FindResumePoint(const job::JobSpec& config,
                                                               const job::JobPlan& plan);

// FindResumePoint for ranks in separate processes: rank 0 finds and checks the checkpoint
// and publishes its directory (or its error) under resume/ in the store; the other ranks
// wait for that (up to `timeout`) and open the same checkpoint by its manifest, so every rank
// resumes from the same one and the files are read in full once.
absl::StatusOr<std::optional<FoundCheckpoint>> FindResumePointShared(
    rendezvous::KeyValueStore& store, const job::JobSpec& config, const job::JobPlan& plan,
    int rank, absl::Duration timeout);

// Where the rank at place `stage` of a pipeline starts: fresh, or at the checkpoint's step
// with the layers of its model stages read (job::RankLayers).
absl::StatusOr<job::StageStart> StageStartFrom(const std::optional<FoundCheckpoint>& found,
                                               const job::JobPlan& plan, int stage);

}  // namespace pipetrain::checkpoint
