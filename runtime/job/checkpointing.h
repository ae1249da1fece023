// A job's checkpoints, as the runtime's hosts write and resume them (the format and the
// directory protocol: runtime/checkpoint, docs/checkpoints.md).
//
// Writing: at a checkpoint boundary N every stage holds W(N) and its optimizer state (2BW
// drains and switches there). The stages of replica 0 (the replicas hold the same weights)
// each write their layers' files into DIR/step-N.tmp/; the last of them to finish writes the
// manifest and commits. A failed write aborts that checkpoint only: `latest` and the earlier
// ones stay, and the error is returned to the stage that saw it (the job goes on).
//
// Resuming: the checkpoint named by resume_from is found and checked file by file
// (checkpoint::FindCheckpoint, falling back past a corrupt one), then against the job: the
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
#include "runtime/job/job_config.h"
#include "runtime/job/plan.h"

namespace pipetrain::job {

// Thread-safe: the stages of one process deliver concurrently.
class CheckpointSink {
 public:
  CheckpointSink(const JobConfig& config, const JobPlan& plan);

  // Stage `stage` (of replica 0) at boundary `step`: writes its layers, and commits the
  // checkpoint if it is the last stage to deliver. The write's error, if any (also when an
  // earlier stage's write failed the same checkpoint: the first error).
  absl::Status Deliver(int64_t step, int stage, const weights::WeightStore& weights);

  // Checkpoints committed, and failed, so far.
  int committed() const;
  int failed() const;

 private:
  struct Pending {
    std::unique_ptr<checkpoint::CheckpointWriter> writer;
    std::vector<checkpoint::LayerFile> files;
    int delivered = 0;
    absl::Status error;
  };
  const JobConfig& config_;
  const JobPlan& plan_;
  mutable std::mutex mu_;
  std::map<int64_t, Pending> pending_;
  int committed_ = 0, failed_ = 0;
};

// The checkpoint the job resumes from, checked against it; nullopt when resume_from is
// empty. `skipped` (newer checkpoints passed over, each with why) is in the result.
absl::StatusOr<std::optional<checkpoint::FoundCheckpoint>> FindResumePoint(const JobConfig& config,
                                                                           const JobPlan& plan);

// Where stage `stage` starts: fresh, or at the checkpoint's step with its layers read.
absl::StatusOr<StageStart> StageStartFrom(const std::optional<checkpoint::FoundCheckpoint>& found,
                                          const JobPlan& plan, int stage);

}  // namespace pipetrain::job
