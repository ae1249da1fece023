#include "coordinator/placement.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

bool Suits(const PoolWorker& w, const QueuedJob& job) {
  return DeviceKind(w.device) == DeviceKind(job.device) &&
         (job.min_cores <= 0 || w.cores <= 0 || w.cores >= job.min_cores);
}

}  // namespace

PoolWorker PoolWorkerOf(const v1::WorkerInfo& info) {
  return {info.id(), info.cores(), info.state() == v1::WORKER_STATE_IDLE, info.device(),
          info.host()};
}

std::string DeviceKind(const std::string& device) {
  return device.rfind("cuda", 0) == 0 ? "cuda" : device;
}

std::vector<size_t> RankWorkers(int ranks, const HostPlacer& place_on_hosts,
                                const std::vector<PoolWorker>& pool,
                                const std::vector<size_t>& free) {
  std::vector<size_t> in_pool_order(free.begin(), free.begin() + ranks);
  if (!place_on_hosts) return in_pool_order;
  std::map<std::string, size_t> host_index;  // numbered in the order of their first free worker
  std::vector<std::vector<size_t>> on;       // the free workers of each
  for (const size_t i : free) {
    const auto [it, added] = host_index.emplace(pool[i].host, on.size());
    if (added) on.emplace_back();
    on[it->second].push_back(i);
  }
  if (on.size() < 2) return in_pool_order;
  std::vector<int> free_per_host;
  for (const std::vector<size_t>& workers : on) {
    free_per_host.push_back(static_cast<int>(workers.size()));
  }
  const std::vector<int> rank_hosts = place_on_hosts(free_per_host);
  if (static_cast<int>(rank_hosts.size()) != ranks) return in_pool_order;
  std::vector<size_t> next(on.size(), 0), out;
  for (const int h : rank_hosts) {
    if (h < 0 || h >= static_cast<int>(on.size()) || next[h] >= on[h].size()) {
      return in_pool_order;
    }
    out.push_back(on[h][next[h]++]);
  }
  return out;
}

PlacementPlan PlaceQueuedJobs(const std::vector<QueuedJob>& queued,
                              const std::vector<PoolWorker>& pool) {
  PlacementPlan plan;
  std::vector<bool> taken(pool.size(), false);
  for (const QueuedJob& job : queued) {
    std::vector<size_t> free;  // suitable and idle, not taken by an earlier job now
    int suitable = 0, suitable_idle = 0;
    for (size_t i = 0; i < pool.size(); ++i) {
      if (!Suits(pool[i], job)) continue;
      ++suitable;
      if (!pool[i].idle) continue;
      ++suitable_idle;
      if (!taken[i]) free.push_back(i);
    }
    if (job.ranks >= 1 && free.size() >= static_cast<size_t>(job.ranks)) {
      Placement p{job.id, {}};
      for (const size_t i : RankWorkers(job.ranks, job.place_on_hosts, pool, free)) {
        taken[i] = true;
        p.rank_workers.push_back(pool[i].id);
      }
      plan.started.push_back(std::move(p));
      continue;
    }
    std::string workers = absl::StrCat(job.ranks, job.ranks == 1 ? " worker" : " workers");
    if (DeviceKind(job.device) != "cpu") absl::StrAppend(&workers, " on ", job.device);
    if (job.min_cores > 0) {
      absl::StrAppend(&workers, " with at least ", job.min_cores, " cores (threads_per_stage)");
    }
    std::string reason;
    if (suitable < job.ranks) {
      const bool narrowed = job.min_cores > 0 || DeviceKind(job.device) != "cpu";
      reason = absl::StrCat("needs ", workers, "; the pool has ", suitable,
                            narrowed ? absl::StrCat(" such (of ", pool.size(), ")") : "",
                            ": it waits for more to register");
    } else {
      reason = absl::StrCat(
          "needs ", workers, ", ", free.size(), " idle",
          suitable_idle > static_cast<int>(free.size())
              ? absl::StrCat(" (", suitable_idle - free.size(), " more taken by earlier jobs)")
              : "");
    }
    plan.waiting.push_back({job.id, std::move(reason)});
  }
  return plan;
}

std::vector<model::PipelineLayout> RecoveryLayouts(const model::PipelineLayout& original,
                                                   int workers, bool stages_fixed) {
  std::vector<model::PipelineLayout> out;
  if (original.ranks() <= workers) out.push_back(original);
  const int64_t batch = int64_t{original.replicas} * original.micro_batches;
  std::vector<model::PipelineLayout> smaller;
  for (int p = stages_fixed ? original.stages : 1; p <= original.stages; ++p) {
    for (int w = 1; w <= original.replicas; ++w) {
      if (batch % w != 0 || p * w > workers) continue;
      if (p == original.stages && w == original.replicas) continue;
      model::PipelineLayout l = original;
      l.stages = p;
      l.replicas = w;
      l.micro_batches = static_cast<int>(batch / w);
      if (p != original.stages) l.stage_layers.clear();
      smaller.push_back(std::move(l));
    }
  }
  std::sort(smaller.begin(), smaller.end(),
            [](const model::PipelineLayout& a, const model::PipelineLayout& b) {
              if (a.ranks() != b.ranks()) return a.ranks() > b.ranks();
              return a.stages > b.stages;
            });
  out.insert(out.end(), smaller.begin(), smaller.end());
  return out;
}

std::vector<std::string> KeepStagesOnTheirHolders(
    const std::vector<std::string>& rank_workers, int stages,
    const std::function<int(const std::string&)>& held_stage,
    const std::function<std::string(const std::string&)>& host_of) {
  const int ranks = static_cast<int>(rank_workers.size());
  stages = std::max(1, stages);
  std::map<std::string, std::vector<int>> ranks_on;  // host -> its ranks, ascending
  for (int r = 0; r < ranks; ++r) ranks_on[host_of(rank_workers[r])].push_back(r);
  std::vector<std::string> out(rank_workers.size());
  for (const auto& [host, on_host] : ranks_on) {
    std::vector<bool> used(on_host.size(), false);  // the host's workers, as on_host's
    std::vector<bool> placed(on_host.size(), false);
    // Each rank takes the first worker of its host holding its stage, if one is left.
    for (size_t i = 0; i < on_host.size(); ++i) {
      const int stage = on_host[i] % stages;
      for (size_t k = 0; k < on_host.size(); ++k) {
        if (!used[k] && held_stage(rank_workers[on_host[k]]) == stage) {
          out[on_host[i]] = rank_workers[on_host[k]];
          used[k] = placed[i] = true;
          break;
        }
      }
    }
    // The others take the workers left, in their order.
    size_t next = 0;
    for (size_t i = 0; i < on_host.size(); ++i) {
      if (placed[i]) continue;
      while (used[next]) ++next;
      out[on_host[i]] = rank_workers[on_host[next]];
      used[next] = true;
    }
  }
  return out;
}

}  // namespace pipetrain::coordinator
