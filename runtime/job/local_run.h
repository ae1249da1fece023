// Runs a job in this process: one thread per pipeline stage over the in-process transport.
//
// The runner builds the whole model once from the seed, cuts it into stages (explicit
// ranges or a balanced split), gives each stage its weight store (one version, or two for
// 2BW), its schedule and its data (stage 0 reads inputs, the last stage reads targets, both
// from the same deterministic sampler), runs all stages to the end and gathers the report.
// A reference trainer runs the same model as one un-pipelined stage on the same
// initialization and data with LibTorch's own optimizers, for checking exactness.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/job/job_config.h"
#include "runtime/transport/transport.h"

namespace pipetrain::job {

struct StageReport {
  int stage = 0;
  model::LayerRange layers;
  int peak_stashed_microbatches = 0;
  int peak_weight_versions = 0;
  double compute_s = 0;
  double wait_s = 0;
};

struct JobReport {
  std::string schedule;
  int stages = 0;
  int micro_batches = 0;
  int micro_batch_size = 0;
  int steps = 0;
  std::string model_summary;  // "gpt: 7 layers, 221k parameters"
  std::string data_summary;
  std::vector<model::LayerRange> partition;
  std::vector<double> losses;  // one per step, mean over the step's micro-batches
  std::optional<double> data_entropy;
  double step_time_s = 0;        // median over steps after the first
  double ideal_step_time_s = 0;  // simulator, fed with this run's measured compute times
  double wall_s = 0;
  double samples_per_s = 0;      // rows (sequences or examples) per second after step 0
  double tokens_per_s = 0;       // target tokens per second after step 0 (token data)
  bool token_data = false;       // tokens_per_s is meaningful
  int threads_per_stage = 1;
  std::vector<StageReport> per_stage;
  std::optional<double> max_param_rel_diff;  // set by CompareWithReference

  // For tests and tools: every stage's full measurements, and the final parameters of the
  // whole model in layer order (what a checkpoint would hold).
  std::vector<executor::StageStats> stage_stats;
  std::vector<at::Tensor> final_parameters;
  std::vector<at::Tensor> final_buffers;
};

struct Progress {
  int64_t step = 0;  // 0-based, finished
  int64_t steps = 0;
  double loss = 0;
  double elapsed_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
};

struct RunOptions {
  // Called from a stage thread after each finished step, in step order.
  std::function<void(const Progress&)> on_progress;
  // Wraps each stage's transport, e.g. with a fault-injecting one in tests.
  std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>,
                                                      int stage)>
      wrap_transport;
};

// Validates the job fully (including the partition against the model's layers) and runs it.
// The first error of any stage stops every stage and is returned.
absl::StatusOr<JobReport> RunInProcess(const JobConfig& config, const RunOptions& options = {});

// Trains the same model as one stage, micro-batch by micro-batch (loss scaled by 1/m),
// with torch::optim::SGD/AdamW; for 2BW with the delayed update
// W(t+1) = W(t) - step(grad f(W(t-1))), W(-1) = W(0). Returns the final parameters in layer
// order. Float64 when the job says so.
absl::StatusOr<std::vector<at::Tensor>> TrainReference(const JobConfig& config);

// max over tensors of ||a - b|| / ||b|| (b: the reference); 0/0 counts as 0.
double MaxRelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

}  // namespace pipetrain::job
