// Where a layout's ranks run when the workers are on several hosts, whose links between them
// are slower than within (docs/planning.md "Hosts"). A rank's host decides which of its
// traffic crosses hosts: the activations and gradients between neighbouring stages of one
// replica, and the gradient AllReduce among the replicas of one stage. Which of the two to
// keep within hosts depends on the model (activation bytes against parameter bytes), the
// schedule (what overlaps what) and the links, so the candidates are scored by the
// simulation (predict.h) and the fastest is taken.
//
// Pure functions; thread-compatible.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/pipeline_layout.h"
#include "runtime/planner/predict.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

// How many replicas send a message from the rank at pipeline position `from` to the one at
// `to` over one link between two hosts (the most over the ordered pairs of hosts; 0 where it
// crosses none: within a rank, and for a layout without rank_hosts). The replicas run one timeline,
// so those messages leave at the same instant and share that link's bandwidth; links are taken as
// full duplex (the gradients going back share the reverse direction alike).
int ReplicasSharingLink(const Layout& layout, int from, int to);
// Whether stage s's replicas are on more than one host (its AllReduce ring spans hosts).
bool ReplicasSpanHosts(const Layout& layout, int s);
// InvalidArgument when the layout's rank_hosts (if any) do not name one host of `cluster` per
// rank, or put more ranks on a host than it has workers.
absl::Status CheckRankHosts(const ClusterProfile& cluster, const Layout& layout);

// What a candidate keeps together on a host:
//   kPipelines  each replica's stages (rank order): stage boundaries stay within hosts where
//               a replica fits one, and a stage's AllReduce ring spans hosts;
//   kStages     each stage's replicas: its AllReduce stays within a host where they fit one,
//               and the stage boundaries span hosts.
enum class HostOrder { kPipelines, kStages };

// "pipelines together", "stages together".
std::string_view HostOrderName(HostOrder order);

// The host of each rank (rank = replica x stages + stage) for `order`: its groups (a
// replica's stages, or a stage's replicas) in turn, each whole on the host with the fewest
// free workers that still holds it (ties: the lower index), else split over the hosts with
// the most free workers. `free_workers[h]`: the workers host h has for this layout.
// InvalidArgument when all the hosts together have fewer workers than the layout has ranks.
absl::StatusOr<std::vector<int>> FillHosts(const model::PipelineLayout& pipeline,
                                           const std::vector<int>& free_workers, HostOrder order);

struct HostPlacement {
  HostOrder order = HostOrder::kPipelines;
  std::vector<int> rank_hosts;
  Prediction prediction;
};

// The distinct placements of `layout` on the hosts of `cluster` (host_workers), each
// predicted, fastest first (ties: in HostOrder's order). One host: one placement, every
// rank on it. `layout.rank_hosts` is ignored. Errors: FillHosts's and Predict's.
absl::StatusOr<std::vector<HostPlacement>> RankHostPlacements(const ModelProfile& profile,
                                                              const ClusterProfile& cluster,
                                                              const Layout& layout);

}  // namespace pipetrain::planner
