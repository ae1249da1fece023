// The planners' cost oracle: the step time and per-stage peak memory of one layout, found by
// running every stage's real action list (runtime/schedule) through a discrete-event
// simulation with the profiled costs.
//
// What the simulation models, as the executor does it (docs/design.md sections 3-5):
//   - each stage runs its list in order; F<j> costs the forward of its layers, B<j> their
//     backward plus the forward of every layer it recomputes; the last stage's loss is part of
//     its last layer's costs;
//   - SEND never blocks; the message reaches the peer link.latency + bytes / bandwidth later
//     (as measured between busy ranks on one host, else the cluster's link; between stages on
//     different hosts, for any replica, the between-hosts link, whose bandwidth the k
//     replicas sending that message over one link at the same instant share: latency +
//     k x bytes / bandwidth), and RECV waits for it;
//   - STEP<t> with w > 1 replicas first averages the stage's gradients: a ring AllReduce of its
//     parameter bytes (on the between-hosts AllReduce link when its replicas are on more
//     than one host). Stages s > 0 (and stage 0 without overlap) start it at STEP; stage 0
//     with overlap starts it with its last backward of the step, bucket by bucket (the buckets'
//     AllReduces pipelined: one latency), so it ends no sooner than that backward plus the
//     last bucket's AllReduce. Then the optimizer
//     updates the stage's layers;
//   - with `shared_cores`, ranks that compute at the same time share those cores equally
//     (w replicas of a stage run the same timeline, so each computing stage counts w times),
//     and k of them computing at once each run the profile's slowdown[k - 1] times slower;
//   - the step time is the steady-state time between two STEPs of stage 0 (the mean over the
//     middle steps of eight).
// Memory of a stage (bytes of tensors, the process's own code and libraries not counted):
//   weights   = versions x parameter bytes + optimizer bytes (WeightVersions: 2BW keeps 2,
//               pipedream 1 + ceil((p − s − 1)/m), the others 1), and under pipedream a
//               second gradient where a step's micro-batches run on two versions
//   per micro-batch in flight: the stage's input (as received: see the profile's
//               inline_buffer_bytes), and per layer its stash and output, except
//               inside a run of recomputed layers, which keeps only the run's output
//   held      = the most, over the stage's action list, of its micro-batches in flight (each
//               from its F to its B) and its gradient (one copy of the parameters), which
//               exists from the step's first backward to its update; that first backward
//               frees its micro-batch's stash as the gradient appears, so it holds the larger
//               of the two, not both (one micro-batch a step never holds both)
//   transient = the largest recomputed run's stash and outputs (rebuilt during its backward)
//               plus the largest working_bytes of a layer of the stage
//   peak      = weights + held + transient + the profile's base_bytes (the dataset every
//               rank holds) + receive_buffer_bytes per stream of messages the stage receives
//               (activations and step commands from s - 1, gradients from s + 1).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/pipeline_layout.h"
#include "runtime/planner/profile.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::planner {

// One runnable layout of a job as a planner scores it: a pipeline layout
// (runtime/model/pipeline_layout.h) with its layers fixed, plus the schedule, recomputation
// and AllReduce overlap.
// A layout the planners consider: the job's pipeline layout (model::PipelineLayout, the one
// type checkpoints record and recovery chooses among; here every stage's layers are fixed)
// with what the planner decides beside it: the schedule, recomputation and the AllReduce.
struct Layout {
  schedule::ScheduleKind schedule = schedule::ScheduleKind::kOneFOneB;
  // p stages with their layers [begin, end), contiguous from 0 (set by SetStageLayers, which
  // keeps the count and the ranges together; Predict refuses a layout where they differ),
  // w replicas, m micro-batches of b rows per step per replica.
  model::PipelineLayout pipeline;
  std::vector<bool> recompute;    // per global layer (empty: none)
  bool overlap_allreduce = true;  // stage 0's bucketed AllReduce
  int64_t bucket_bytes = 4 << 20;
  // The host of each rank (rank = replica x stages + stage, runtime/base/rank_layout.h): an
  // index into ClusterProfile::host_workers (planner/host_placement.h chooses it). Empty:
  // every rank on one host.
  std::vector<int> rank_hosts;
  // v, the model stages a rank holds (a schedule that HoldsChunks; 1 otherwise): then
  // `pipeline.stages` is the ranks p of a pipeline and `pipeline.stage_layers` the v x p
  // model stages in model order (SetModelStageLayers).
  int virtual_stages = 1;
  bool vertical_sync = false;  // pipedream: every stage on stage 0's versions (JobSpec's)

  void SetStageLayers(std::vector<std::pair<int, int>> layers) {
    pipeline.stages = static_cast<int>(layers.size());
    pipeline.stage_layers = std::move(layers);
    virtual_stages = 1;
  }
  // `layers`: v x p model stages, v per rank. REQUIRES: layers.size() a multiple of v.
  void SetModelStageLayers(std::vector<std::pair<int, int>> layers, int v) {
    virtual_stages = v;
    pipeline.stages = static_cast<int>(layers.size()) / v;
    pipeline.stage_layers = std::move(layers);
  }
  int stages() const { return pipeline.stages; }
  int64_t global_batch() const { return pipeline.global_batch(); }
  bool recomputes(int layer) const {
    return layer < static_cast<int>(recompute.size()) && recompute[layer];
  }
};

// Per stage; for a schedule with chunks, per rank (all its model stages).
struct StagePrediction {
  double compute_s = 0;            // per step: forwards, backwards, recomputation, optimizer
  double allreduce_s = 0;          // per step: the AllReduce of its gradients (0 for w = 1)
  double exposed_allreduce_s = 0;  // the part of it the stage waits for
  int peak_in_flight = 0;          // micro-batches
  int64_t weight_bytes = 0;        // weights (every version) and optimizer state
  int64_t activation_bytes = 0;    // at the peak: micro-batches in flight, a backward, gradient
  int64_t peak_memory_bytes = 0;   // the sum
};

// The versions of its weights stage s of p keeps at once with m micro-batches a step: 2BW
// two; pipedream (weight stashing) the newest and those its micro-batches in flight ran on,
// 1 + ceil((p − s − 1) / m) (p − s with m = 1), and under vertical sync, where a stage after
// the first keeps stage 0's versions from the latest it was given to its newest,
// 2 + ceil((p − 1) / m) there; the others one.
int WeightVersions(schedule::ScheduleKind schedule, int stages, int stage, int micro_batches,
                   bool vertical_sync = false);
// A stage's weights as the simulation counts them: `versions` copies of its parameters
// (WeightVersions) and the optimizer's state. Its gradient, one more copy of the parameters,
// is counted with what the stage holds (StagePrediction::activation_bytes); under pipedream
// where a step's micro-batches run on two versions (the warm-up p − s − 1 not a multiple of
// m), each accumulating its own, Predict adds a second to the stage's weight_bytes.
int64_t WeightBytes(int versions, int64_t parameter_bytes, int64_t optimizer_bytes);

struct Prediction {
  double step_time_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  std::vector<StagePrediction> stages;
  int64_t peak_memory_bytes = 0;  // the largest stage's
};

// InvalidArgument for a layout that does not fit the profile (stages not contiguous over every
// layer, a bad count, m < p for 2BW), rank hosts that do not fit the cluster's hosts, or a
// profile without sizes.
absl::StatusOr<Prediction> Predict(const ModelProfile& profile, const ClusterProfile& cluster,
                                   const Layout& layout);

}  // namespace pipetrain::planner
