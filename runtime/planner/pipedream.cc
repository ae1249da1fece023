#include "runtime/planner/pipedream.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pipetrain::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

absl::Status Check(const std::vector<LayerProfile>& layers, const ClusterProfile& cluster) {
  if (layers.empty()) return absl::InvalidArgumentError("the model has no layers");
  if (cluster.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("workers: at least 1, got ", cluster.workers));
  }
  if (!(cluster.link.bytes_per_s > 0)) {
    return absl::InvalidArgumentError("the link's bandwidth must be positive");
  }
  return absl::OkStatus();
}

// The slowest-stage time of `stages` (each T, and C at every boundary).
double Slowest(const std::vector<LayerProfile>& layers, const std::vector<PlannedStage>& stages,
               const LinkProfile& link) {
  double slowest = 0;
  for (size_t s = 0; s < stages.size(); ++s) {
    slowest = std::max(slowest, stages[s].time_s);
    if (s + 1 < stages.size())
      slowest = std::max(slowest, BoundaryTime(layers, stages[s].end - 1, link));
  }
  return slowest;
}

}  // namespace

double StageTime(const std::vector<LayerProfile>& layers, int begin, int end, int replicas,
                 const LinkProfile& link) {
  double compute = 0, bytes = 0;
  for (int l = begin; l < end; ++l) {
    compute += layers[l].forward_s + layers[l].backward_s;
    bytes += static_cast<double>(layers[l].parameter_bytes);
  }
  const double sync =
      replicas > 1 ? 4.0 * (replicas - 1) * bytes / (replicas * link.bytes_per_s) : 0.0;
  return std::max(compute, sync) / replicas;
}

double BoundaryTime(const std::vector<LayerProfile>& layers, int layer, const LinkProfile& link) {
  return 2 * (link.latency_s + static_cast<double>(layers[layer].output_bytes) / link.bytes_per_s);
}

absl::StatusOr<PipeDreamPlan> PlanPipeDream(const std::vector<LayerProfile>& layers,
                                            const ClusterProfile& cluster) {
  if (absl::Status s = Check(layers, cluster); !s.ok()) return s;
  const int L = static_cast<int>(layers.size()), N = cluster.workers;
  // best[j][m]: the best slowest-stage time for layers 0..j on exactly m workers; how[j][m]:
  // the last stage's first layer and replicas (first layer 0: one stage).
  std::vector<std::vector<double>> best(L, std::vector<double>(N + 1, kInfinity));
  std::vector<std::vector<std::pair<int, int>>> how(L, std::vector<std::pair<int, int>>(N + 1));
  for (int j = 0; j < L; ++j) {
    for (int m = 1; m <= N; ++m) {
      best[j][m] = StageTime(layers, 0, j + 1, m, cluster.link);
      how[j][m] = {0, m};
      for (int i = 0; i < j; ++i) {
        const double boundary = BoundaryTime(layers, i, cluster.link);
        for (int last = 1; last < m; ++last) {
          const double candidate = std::max(
              {best[i][m - last], boundary, StageTime(layers, i + 1, j + 1, last, cluster.link)});
          if (candidate < best[j][m]) {
            best[j][m] = candidate;
            how[j][m] = {i + 1, last};
          }
        }
      }
    }
  }
  PipeDreamPlan plan;
  for (int j = L - 1, m = N; j >= 0;) {
    const auto [begin, replicas] = how[j][m];
    plan.stages.push_back(
        {begin, j + 1, replicas, StageTime(layers, begin, j + 1, replicas, cluster.link)});
    j = begin - 1;
    m -= replicas;
  }
  std::reverse(plan.stages.begin(), plan.stages.end());
  plan.slowest_s = Slowest(layers, plan.stages, cluster.link);
  return plan;
}

absl::StatusOr<PipeDreamPlan> BruteForcePipeDream(const std::vector<LayerProfile>& layers,
                                                  const ClusterProfile& cluster) {
  if (absl::Status s = Check(layers, cluster); !s.ok()) return s;
  const int L = static_cast<int>(layers.size()), N = cluster.workers;
  PipeDreamPlan best;
  best.slowest_s = kInfinity;
  // Every set of cuts between layers, then every way to give the stages N workers.
  for (uint32_t cuts = 0; cuts < (1u << (L - 1)); ++cuts) {
    std::vector<PlannedStage> stages;
    int begin = 0;
    for (int l = 0; l < L; ++l) {
      if (l == L - 1 || (cuts >> l) & 1u) {
        stages.push_back({begin, l + 1, 1, 0});
        begin = l + 1;
      }
    }
    if (static_cast<int>(stages.size()) > N) continue;
    std::function<void(size_t, int)> give = [&](size_t s, int left) {
      if (s + 1 == stages.size()) {
        stages[s].replicas = left;
        std::vector<PlannedStage> plan = stages;
        for (PlannedStage& st : plan) {
          st.time_s = StageTime(layers, st.begin, st.end, st.replicas, cluster.link);
        }
        const double slowest = Slowest(layers, plan, cluster.link);
        if (slowest < best.slowest_s) best = {plan, slowest};
        return;
      }
      const int rest = static_cast<int>(stages.size() - s - 1);  // at least one each
      for (int r = 1; r <= left - rest; ++r) {
        stages[s].replicas = r;
        give(s + 1, left - r);
      }
    };
    give(0, N);
  }
  return best;
}

absl::StatusOr<PipeDreamPlan> PartitionPipeDream(const std::vector<LayerProfile>& layers,
                                                 int stages, int replicas,
                                                 const LinkProfile& link) {
  const int L = static_cast<int>(layers.size());
  if (stages < 1 || stages > L || replicas < 1 || !(link.bytes_per_s > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("a partition needs 1 <= stages <= layers (", L,
                                                   "), replicas >= 1 and a positive "
                                                   "bandwidth: got ",
                                                   stages, " stages, ", replicas, " replicas"));
  }
  // best[k][j]: the best slowest-stage time for layers 0..j-1 in k stages; first[k][j]: the
  // first layer of the k-th stage.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, kInfinity));
  std::vector<std::vector<int>> first(stages + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k) {
    for (int j = k; j <= L; ++j) {
      for (int i = k - 1; i < j; ++i) {
        if (best[k - 1][i] == kInfinity) continue;
        double t = std::max(best[k - 1][i], StageTime(layers, i, j, replicas, link));
        if (i > 0) t = std::max(t, BoundaryTime(layers, i - 1, link));
        if (t < best[k][j]) {
          best[k][j] = t;
          first[k][j] = i;
        }
      }
    }
  }
  PipeDreamPlan plan;
  plan.slowest_s = best[stages][L];
  for (int k = stages, j = L; k > 0; --k) {
    const int i = first[k][j];
    plan.stages.insert(plan.stages.begin(),
                       PlannedStage{i, j, replicas, StageTime(layers, i, j, replicas, link)});
    j = i;
  }
  return plan;
}

}  // namespace pipetrain::planner
