#include "runtime/planner/host_placement.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/base/rank_layout.h"

namespace pipetrain::planner {

std::string_view HostOrderName(HostOrder order) {
  return order == HostOrder::kPipelines ? "pipelines together" : "stages together";
}

int ReplicasSharingLink(const Layout& layout, int from, int to) {
  const std::vector<int>& hosts = layout.rank_hosts;
  if (hosts.empty() || from == to) return 0;
  const RankLayout ranks{layout.stages(), layout.pipeline.replicas};
  std::map<std::pair<int, int>, int> on_link;  // (from host, to host) -> replicas crossing
  int most = 0;
  for (int k = 0; k < ranks.replicas; ++k) {
    const int from_host = hosts[ranks.RankOf(from, k)], to_host = hosts[ranks.RankOf(to, k)];
    if (from_host != to_host) most = std::max(most, ++on_link[{from_host, to_host}]);
  }
  return most;
}

bool ReplicasSpanHosts(const Layout& layout, int s) {
  const std::vector<int>& hosts = layout.rank_hosts;
  if (hosts.empty()) return false;
  const RankLayout ranks{layout.stages(), layout.pipeline.replicas};
  for (int k = 1; k < ranks.replicas; ++k) {
    if (hosts[ranks.RankOf(s, k)] != hosts[ranks.RankOf(s, 0)]) return true;
  }
  return false;
}

absl::Status CheckRankHosts(const ClusterProfile& cluster, const Layout& layout) {
  if (layout.rank_hosts.empty()) return absl::OkStatus();
  const int ranks = layout.pipeline.ranks();
  if (static_cast<int>(layout.rank_hosts.size()) != ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank_hosts names ", layout.rank_hosts.size(),
                                                   " ranks; the layout has ", ranks));
  }
  std::vector<int> on_host(cluster.hosts(), 0);
  for (const int h : layout.rank_hosts) {
    if (h < 0 || h >= cluster.hosts()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank_hosts names host ", h, "; the cluster has ", cluster.hosts()));
    }
    ++on_host[h];
  }
  for (int h = 0; h < cluster.hosts() && !cluster.host_workers.empty(); ++h) {
    if (on_host[h] > cluster.host_workers[h]) {
      return absl::InvalidArgumentError(absl::StrCat("rank_hosts puts ", on_host[h],
                                                     " ranks on host ", h, ", which has ",
                                                     cluster.host_workers[h], " workers"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> FillHosts(const model::PipelineLayout& pipeline,
                                           const std::vector<int>& free_workers, HostOrder order) {
  const int p = pipeline.stages, w = pipeline.replicas;
  const int total = std::accumulate(free_workers.begin(), free_workers.end(), 0);
  if (total < pipeline.ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat(pipeline.ranks(), " ranks; the hosts have ", total, " workers"));
  }
  const RankLayout ranks{p, w};
  std::vector<std::vector<int>> groups;
  if (order == HostOrder::kPipelines) {
    for (int k = 0; k < w; ++k) {
      groups.emplace_back();
      for (int s = 0; s < p; ++s) groups.back().push_back(ranks.RankOf(s, k));
    }
  } else {
    for (int s = 0; s < p; ++s) {
      groups.emplace_back();
      for (int k = 0; k < w; ++k) groups.back().push_back(ranks.RankOf(s, k));
    }
  }
  std::vector<int> free = free_workers;
  std::vector<int> rank_hosts(pipeline.ranks(), -1);
  const int hosts = static_cast<int>(free.size());
  for (const std::vector<int>& group : groups) {
    const int size = static_cast<int>(group.size());
    int whole = -1;  // the tightest host that holds the group
    for (int h = 0; h < hosts; ++h) {
      if (free[h] >= size && (whole < 0 || free[h] < free[whole])) whole = h;
    }
    if (whole >= 0) {
      for (const int r : group) rank_hosts[r] = whole;
      free[whole] -= size;
      continue;
    }
    for (const int r : group) {  // split: the roomiest hosts first
      const int h = static_cast<int>(std::max_element(free.begin(), free.end()) - free.begin());
      rank_hosts[r] = h;
      --free[h];
    }
  }
  return rank_hosts;
}

absl::StatusOr<std::vector<HostPlacement>> RankHostPlacements(const ModelProfile& profile,
                                                              const ClusterProfile& cluster,
                                                              const Layout& layout) {
  std::vector<HostPlacement> out;
  for (const HostOrder order : {HostOrder::kPipelines, HostOrder::kStages}) {
    HostPlacement placement;
    placement.order = order;
    if (cluster.hosts() > 1) {
      absl::StatusOr<std::vector<int>> hosts =
          FillHosts(layout.pipeline, cluster.host_workers, order);
      if (!hosts.ok()) return hosts.status();
      placement.rank_hosts = *std::move(hosts);
    }
    if (std::any_of(out.begin(), out.end(), [&](const HostPlacement& earlier) {
          return earlier.rank_hosts == placement.rank_hosts;
        })) {
      continue;
    }
    Layout placed = layout;
    placed.rank_hosts = placement.rank_hosts;
    absl::StatusOr<Prediction> prediction = Predict(profile, cluster, placed);
    if (!prediction.ok()) return prediction.status();
    placement.prediction = *std::move(prediction);
    out.push_back(std::move(placement));
  }
  std::stable_sort(out.begin(), out.end(), [](const HostPlacement& a, const HostPlacement& b) {
    return a.prediction.step_time_s < b.prediction.step_time_s * (1 - 1e-9);
  });
  return out;
}

}  // namespace pipetrain::planner
