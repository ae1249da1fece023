// What `pipetrain run --summary` (and pipetrain-run --summary) writes at the end of a run:
// one JSON schema in every launch mode (threads, processes, a local cluster of daemons),
// documented in docs/design.md section 8.8. Every key is always present; a figure a launch
// mode does not measure is null there (the table there says which), so that a reader never
// branches on the mode. tests/cli/cli_test.cc checks that the modes write the
// same keys and agree on the job, its layout and its losses.
//
// Pure: a value type and its JSON; no gRPC, no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/v1/job.pb.h"

namespace pipetrain::jobspec {

// One stage of replica 0.
struct StageSummary {
  int stage = 0;
  std::optional<std::pair<int, int>> layers;  // [begin, end) of its (first) model stage
  // Each model stage's layers where a rank holds several (a schedule with chunks), else empty.
  std::vector<std::pair<int, int>> model_stage_layers;
  std::optional<std::string> worker;  // the worker that ran it (a cluster)
  double compute_s = 0;
  double wait_s = 0;
  std::optional<double> allreduce_s;
  std::optional<int> peak_stashed_microbatches;
  std::optional<int> peak_weight_versions;
  int64_t parameter_bytes = 0;    // one version of the stage's own parameters
  int64_t peak_memory_bytes = 0;  // the resident high-water mark of its process
  int64_t peak_tensor_bytes = 0;  // the most tensor storage its process held at once
  std::optional<int64_t> bytes_sent;
};

struct RunSummary {
  std::string launch;                 // threads | processes | cluster
  std::optional<std::string> job_id;  // the coordinator's (a cluster)
  std::string state = "succeeded";    // a summary is written for a run that succeeded
  std::string schedule;
  int stages = 0;
  int replicas = 0;
  int microbatches = 0;
  int microbatch_size = 0;
  int64_t steps = 0;
  std::optional<std::string> model;  // "gpt: 7 layers, 221k parameters"
  std::optional<std::string> data;
  std::vector<std::pair<int, int>> partition;  // each stage's layers [begin, end)
  int64_t first_step = 0;                      // of losses[0]: a resumed run's checkpoint step
  std::vector<double> losses;          // every step's loss (the mean over the replicas), in order
  std::vector<double> learning_rates;  // every step's learning rate, one per loss
  // With clipping (the optimizer's threshold): every step's gradient norm before it, one per
  // loss; empty without.
  std::vector<double> grad_norms;
  // With eval.every: every evaluation on held-out data, before step `step` (on the weights
  // after `step` updates), the mean over the replicas.
  struct Eval {
    int64_t step = 0;
    double loss = 0;
    double accuracy = 0;
  };
  std::vector<Eval> evals;
  int64_t skipped_steps = 0;  // updates skipped for a non-finite loss or gradient
  std::optional<double> data_entropy;
  double step_time_s = 0;  // median of rank 0's step-to-step times, its first step left out
  std::optional<double> ideal_step_time_s;  // the simulator's, from this run's compute times
  std::optional<double> allreduce_s;        // with replicas (medians per step)
  std::optional<double> exposed_allreduce_s;
  double samples_per_s = 0;
  std::optional<double> tokens_per_s;  // token data
  double wall_s = 0;
  std::optional<int> threads_per_stage;
  std::vector<StageSummary> per_stage;       // replica 0's stages, in order
  std::optional<std::string> plan_json;      // `stages: auto`: the plan (a JSON object)
  std::optional<double> max_param_rel_diff;  // --reference
  std::string config_json;                   // the job as it ran (job::JobToJson)
};

// The summary as JSON text (indented), every key present.
std::string RunSummaryJson(const RunSummary& summary);

// A plan's record (`stages: auto`) as the summary's "plan" object: planner, layout, workers,
// predicted_step_time_s, predicted_peak_memory_bytes (per stage), memory_efficiency.
std::string PlannedLayoutJson(const v1::PlannedLayout& plan);

}  // namespace pipetrain::jobspec
