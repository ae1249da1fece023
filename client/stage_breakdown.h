// `pipetrain metrics`: where each rank of a job spends a step, from the coordinator's job
// record (no Prometheus needed). For every (stage, replica): milliseconds per step, averaged
// over the steps it finished, computing (forward, backward, optimizer), receiving
// (activations, gradients: mostly blocked on the peer), sending; these add up to the rank's
// whole time. Then the part of backward and optimizer spent in the gradient AllReduce that
// backward did not hide; the last step's time and bubble ratio; the straggler ratio (compute
// per step over its replica's median stage; the alert fires above 1.5); the process's peak
// memory. Pure formatting: no gRPC here.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

// The straggler ratio from which a stage is marked (deploy/prometheus/alerts.yml's).
inline constexpr double kStragglerRatio = 1.5;

// "  grad norm 1.234" for a job that clips (Job.has_grad_norm), else "".
std::string GradNormText(const v1::Job& job);
// "held-out loss 2.1234 accuracy 0.3125 (before step 40)" for a job that has evaluated, else "".
std::string EvalText(const v1::Job& job);
// The table, header line first; "(no step reported yet)" in place of rows before any.
std::string StageBreakdownTable(const v1::Job& job);
// The same numbers: {"job_id", "step", "loss", "learning_rate", "grad_norm" (null without
// clipping), "eval" ({"step", "loss", "accuracy"}, null before an evaluation),
// "stages": [{"stage", "replica", "worker",
// "steps", "ms_per_step": {...}, "last_step_s", "last_step_bubble_ratio",
// "straggler_ratio", "peak_memory_bytes"}]}.
nlohmann::json StageBreakdownJson(const v1::Job& job);

}  // namespace pipetrain::client
