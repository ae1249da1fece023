// Measures a job's layers as a stage runs them (profiler.h says what is measured): one window
// of consecutive layers at a time, at one micro-batch size.
//
// Memory is counted at the CPU allocator, so the caller installs the counter first
// (memory::CountTensorMemory) and sets the intra-op threads; the counts are the process's,
// so windows are profiled one at a time, from one thread. Errors are those of building the
// layers and making their optimizers.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/plan.h"
#include "runtime/planner/profile.h"
#include "runtime/profiler/profiler.h"

namespace pipetrain::profiler {

// Layers [begin, end) at one micro-batch size, run as a stage runs them: every round a
// forward through the layers in order (the last layer of the model adds the loss), a
// backward through them in reverse, each layer's from the gradient the next one produced
// (the window's last layer, when the model goes on, from a small random gradient of its
// output's shape), then each layer's update (the finiteness check and the optimizer's
// step), so that every layer meets the caches as it does inside a stage. Each layer's input
// is detached from the previous layer's output, so its forward and backward are timed alone.
// `input` is the real input of layer `begin`; `next` receives the window's output (detached).
absl::StatusOr<std::vector<planner::LayerProfile>> ProfileWindow(
    const job::JobSpec& config, const job::JobPlan& plan, int begin, int end,
    const at::Tensor& input, const at::Tensor& targets, const ProfileOptions& options,
    at::Tensor& next);

// Consecutive runs of layers to profile together: as many as keep their parameters, their
// gradients and an AdamW state (4 x the parameters) within `budget` bytes; at least one.
std::vector<std::pair<int, int>> ProfileWindows(const job::JobPlan& plan, int64_t budget);

}  // namespace pipetrain::profiler
