// The PipeDream-2BW planner (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
// Training", ICML 2021, section 4): over depth p and width w with p x w <= workers, every
// micro-batch size b that divides the global batch (m = B / (w b) micro-batches, m >= p), with
// and without recomputation: the plan of highest throughput whose every stage fits a worker's
// memory. Layers are split into p contiguous stages minimizing the slowest stage's compute.
//
// Costs from the profile (measured at micro-batch size b0; times and activation bytes scale
// by b / b0):
//   stage time per micro-batch t_s = forward + backward (+ forward again with recomputation)
//   boundary time per micro-batch  = 2 (latency + output_bytes / bandwidth)
//   gradient AllReduce per step    = 4 (w - 1) |W_s| / (w bandwidth), hidden behind the step's
//                                    backward passes unless longer than them
//   step time = m x max(max_s t_s, max boundary) + max(0, max_s AllReduce - m x max_s t_s)
// Memory of stage s (0-based) in 2BW's steady state: two weight versions, one gradient and
// the optimizer state of its layers, plus p - s micro-batches in flight: each keeps its
// layers' stash_bytes, or with recomputation only its input (the previous layer's
// output_bytes) plus, for the one being recomputed, the full stash.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

struct TwoBWOptions {
  int profiled_micro_batch = 1;       // b0: the micro-batch size of the profile
  int global_batch = 1;               // B, samples per step
  std::vector<int> micro_batch_sizes; // b to consider (empty: every divisor of B)
};

struct TwoBWPlan {
  int stages = 1, replicas = 1, micro_batch_size = 1, micro_batches = 1;
  bool recompute = false;
  std::vector<std::pair<int, int>> stage_layers;  // [begin, end) per stage
  double step_time_s = 0;
  double samples_per_s = 0;
  std::vector<int64_t> stage_memory_bytes;        // per stage, as above
};

// The bytes stage `stage` of `plan` needs (the formula above).
int64_t TwoBWStageMemory(const std::vector<LayerProfile>& layers, const TwoBWPlan& plan,
                         int stage, int profiled_micro_batch);

// The best plan that fits. InvalidArgument for bad input; ResourceExhausted when none fits:
// "does not fit: needs X bytes on stage s, have Y" for the plan that came closest.
absl::StatusOr<TwoBWPlan> PlanTwoBW(const std::vector<LayerProfile>& layers,
                                    const ClusterProfile& cluster, const TwoBWOptions& options);

}  // namespace pipetrain::planner
