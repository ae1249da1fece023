// Runs a job in this process: one thread per pipeline stage over the in-process transport.
//
// The runner plans the job, builds each stage's own layers (never a whole-model copy beside
// them; explicit ranges or a balanced split), gives each stage its weight store (one version, or two for
// 2BW), its schedule and its data (stage 0 reads inputs, the last stage reads targets, both
// from the same deterministic sampler), runs all stages to the end and gathers the report.
// A reference trainer runs the same model as one un-pipelined stage on the same
// initialization and data with LibTorch's own optimizers, for checking exactness.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/control/step_commands.h"
#include "runtime/job/job_config.h"
#include "runtime/job/report.h"
#include "runtime/transport/transport.h"

namespace pipetrain::job {

struct RunOptions {
  // Called from a stage thread after each finished step, in step order.
  std::function<void(const Progress&)> on_progress;
  // Wraps each stage's transport, e.g. with a fault-injecting one in tests.
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>,
                                                      int stage)>
      wrap_transport;
  // Step commands for the run (runtime/control), read by stage 0 of replica 0; may be filled
  // before the run or while it runs.
  std::shared_ptr<control::StepCommandQueue> commands;
};

// Validates the job fully (including the partition against the model's layers) and runs it.
// The first error of any stage stops every stage and is returned.
absl::StatusOr<JobReport> RunInProcess(const JobConfig& config, const RunOptions& options = {});

// Trains the same model as one stage, micro-batch by micro-batch (loss scaled by 1/m),
// with torch::optim::SGD/AdamW; for 2BW with the delayed update
// W(t+1) = W(t) - step(grad f(W(t-1))), W(-1) = W(0), and for each weight-version switch at
// boundary N in `switch_at`, mini-batch N's gradient taken on W(N) (the rule restarts
// there). Returns the final parameters in layer order. Float64 when the job says so.
absl::StatusOr<std::vector<at::Tensor>> TrainReference(const JobConfig& config,
                                                       const std::vector<int64_t>& switch_at = {});

// max over tensors of ||a - b|| / ||b|| (b: the reference); 0/0 counts as 0.
double MaxRelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

}  // namespace pipetrain::job
