// The simulation's parts that Predict (predict.cc) and the prediction of the schedules whose
// ranks hold several model stages (predict_chunked.cc) share. Internal to runtime/planner;
// pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/planner/predict.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner::internal {

// One micro-batch on a stage: what it keeps from its forward to its backward, and the most
// the stage holds for it while that backward runs, with the step's gradient not yet there
// (the step's first backward, which allocates it layer by layer) or already there; and the
// same for the step's last backward of a stage that averages its gradient during it (the
// flat copies the AllReduce makes of the gradient, counted as each piece finishes: at most
// what its buckets, each copied once all its gradients are done, hold).
// `recomputed`: what its recomputed layers stash again when its backward recomputes them;
// under a split backward it stays from I until W (the queued weight gradients hold it).
struct MicroBatchBytes {
  int64_t kept = 0;
  int64_t recomputed = 0;
  int64_t backward_first = 0;
  int64_t backward_later = 0;
  int64_t overlapped_first = 0;
  int64_t overlapped_later = 0;
};

// What a received message of `bytes` occupies (profile.h, inline_buffer_bytes).
int64_t ReceivedBytes(const ModelProfile& profile, int64_t bytes);

// One micro-batch's memory on the (model) stage of layers [begin, end) (see predict.cc).
MicroBatchBytes MicroBatchMemory(const ModelProfile& profile,
                                 const std::vector<LayerProfile>& layers, const Layout& layout,
                                 int begin, int end);

// Steps simulated: the step time is the mean time between the STEPs of steps 1 .. 6, once
// the pipeline (2BW has no flush) is in its steady state and before the last one drains it.
inline constexpr int kSimulatedSteps = 8;

// The speed, against one core of its own, at which each of `computing` things computing at
// once runs (ranks, and the transports' threads where the caller counts them), each of the
// `replicas` running the same: with `shared_cores` they share those cores equally, and k of
// them running at once are slowed by the profile's slowdown[k - 1]; 1 without shared cores.
double SharedCoreRate(const ModelProfile& profile, const ClusterProfile& cluster, int computing,
                      int replicas);

// The prediction's step time (the mean time between the STEPs `step_end` of steps 1 ..
// kSimulatedSteps − 2) and throughputs. InternalError when the simulation did not reach
// every STEP.
absl::Status SetStepTime(const ModelProfile& profile, const Layout& layout,
                         const std::vector<double>& step_end, Prediction& prediction);

// Predict for a layout whose schedule HoldsChunks: `layers` are the profile's at the
// layout's micro-batch size, the layout already checked.
absl::StatusOr<Prediction> PredictChunked(const ModelProfile& profile,
                                          const ClusterProfile& cluster, const Layout& layout,
                                          const std::vector<LayerProfile>& layers);

}  // namespace pipetrain::planner::internal
