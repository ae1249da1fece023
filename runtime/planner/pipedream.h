// PipeDream's partitioner (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for
// DNN Training", SOSP 2019, section 3.1): split the layers into contiguous stages, each run by
// r_s replicas, on exactly `workers` workers, so that the slowest stage (per mini-batch, in
// steady state) is as fast as possible.
//
// Costs, for layers i..j on m replicas (PipeDream's T(i -> j, m)):
//   compute   = sum of forward_s + backward_s over the layers
//   sync      = 4 (m - 1) |w| / (m B)  for the parameter bytes |w|: a ring AllReduce of the
//               gradients (each replica sends and receives 2 (m - 1)/m of them), in seconds at
//               bandwidth B; 0 for m = 1
//   T         = max(compute, sync) / m    (the replicas share the stage's mini-batches; the
//               AllReduce overlaps the backward pass)
// and between stage ending at layer i and the next: C(i) = 2 (latency + output_bytes / B)
// (the activation forward, its gradient back). The slowest-stage time of a plan is the
// largest of its stages' T and of its boundaries' C.
//
// The dynamic program A(j, m) = the best slowest-stage time for layers 0..j on exactly m
// workers:  A(j, m) = min( T(0..j, m),  min over i < j, 1 <= m' < m of
//                           max(A(i, m - m'), C(i), T(i+1..j, m')) )
// is O(L^2 N^2) and exact; `BruteForcePipeDream` enumerates every plan for the tests.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

struct PlannedStage {
  int begin = 0, end = 0;  // layers [begin, end)
  int replicas = 1;
  double time_s = 0;  // T of the stage
};

struct PipeDreamPlan {
  std::vector<PlannedStage> stages;  // in order; replicas add up to the cluster's workers
  double slowest_s = 0;              // the largest stage T or boundary C: the steady-state
                                     // time per mini-batch
};

// The stage time T(begin..end-1, replicas) and the boundary cost C after `layer`.
double StageTime(const std::vector<LayerProfile>& layers, int begin, int end, int replicas,
                 const LinkProfile& link);
double BoundaryTime(const std::vector<LayerProfile>& layers, int layer, const LinkProfile& link);

// InvalidArgument for no layers, no workers or a bandwidth that is not positive.
absl::StatusOr<PipeDreamPlan> PlanPipeDream(const std::vector<LayerProfile>& layers,
                                            const ClusterProfile& cluster);

// pipetrain runs every stage with the same replica count w: the split of the layers into
// exactly `stages` contiguous stages, each on `replicas` replicas, minimizing the same
// slowest-stage time (T(i..j, replicas) and C at each boundary). Exact O(L^2 p) dynamic
// program. InvalidArgument unless 1 <= stages <= layers and replicas >= 1.
absl::StatusOr<PipeDreamPlan> PartitionPipeDream(const std::vector<LayerProfile>& layers,
                                                 int stages, int replicas, const LinkProfile& link);

// Every split into contiguous stages and every replica count per stage using exactly the
// cluster's workers: the best. Exponential; for tests (a few layers and workers).
absl::StatusOr<PipeDreamPlan> BruteForcePipeDream(const std::vector<LayerProfile>& layers,
                                                  const ClusterProfile& cluster);

}  // namespace pipetrain::planner
