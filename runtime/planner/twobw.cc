#include "runtime/planner/twobw.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/model/partition.h"

namespace pipetrain::planner {

int64_t TwoBWStageMemory(const std::vector<LayerProfile>& layers, const TwoBWPlan& plan,
                         int stage, int profiled_micro_batch) {
  const auto [begin, end] = plan.stage_layers[stage];
  const double scale = static_cast<double>(plan.micro_batch_size) / profiled_micro_batch;
  double weights = 0, stash = 0;
  for (int l = begin; l < end; ++l) {
    weights += 3.0 * layers[l].parameter_bytes + layers[l].optimizer_bytes;
    stash += layers[l].stash_bytes * scale;
  }
  const int in_flight = plan.stages - stage;
  double activations;
  if (plan.recompute) {
    const double input = begin > 0 ? layers[begin - 1].output_bytes * scale : 0.0;
    activations = in_flight * input + stash;
  } else {
    activations = in_flight * stash;
  }
  return static_cast<int64_t>(weights + activations);
}

absl::StatusOr<TwoBWPlan> PlanTwoBW(const std::vector<LayerProfile>& layers,
                                    const ClusterProfile& cluster, const TwoBWOptions& o) {
  if (layers.empty()) return absl::InvalidArgumentError("the model has no layers");
  if (cluster.workers < 1 || !(cluster.link.bytes_per_s > 0) || o.global_batch < 1 ||
      o.profiled_micro_batch < 1) {
    return absl::InvalidArgumentError(
        "workers, the link's bandwidth, the global batch and the profiled micro-batch size "
        "must be positive");
  }
  std::vector<int> sizes = o.micro_batch_sizes;
  if (sizes.empty()) {
    for (int b = 1; b <= o.global_batch; ++b) {
      if (o.global_batch % b == 0) sizes.push_back(b);
    }
  }
  const int L = static_cast<int>(layers.size());
  std::optional<TwoBWPlan> best;
  // The closest miss, for the error: the smallest overshoot.
  int64_t miss_need = std::numeric_limits<int64_t>::max();
  int miss_stage = 0;
  for (int p = 1; p <= std::min(L, cluster.workers); ++p) {
    for (int w = 1; p * w <= cluster.workers; ++w) {
      for (int b : sizes) {
        if (b < 1 || o.global_batch % (w * b) != 0) continue;
        const int m = o.global_batch / (w * b);
        if (m < p) continue;  // 2BW needs m >= p
        const double scale = static_cast<double>(b) / o.profiled_micro_batch;
        for (bool recompute : {false, true}) {
          std::vector<double> cost;
          for (const LayerProfile& l : layers) {
            cost.push_back((l.forward_s * (recompute ? 2 : 1) + l.backward_s) * scale);
          }
          TwoBWPlan plan;
          plan.stages = p;
          plan.replicas = w;
          plan.micro_batch_size = b;
          plan.micro_batches = m;
          plan.recompute = recompute;
          absl::StatusOr<std::vector<model::LayerRange>> split =
              model::BalancedPartition(cost, p);  // p <= layers: always a split
          if (!split.ok()) return split.status();
          for (const model::LayerRange& r : *split) plan.stage_layers.emplace_back(r.begin, r.end);
          double slowest = 0, sync = 0;
          for (int s = 0; s < p; ++s) {
            const auto [begin, end] = plan.stage_layers[s];
            double t = 0, bytes = 0;
            for (int l = begin; l < end; ++l) {
              t += cost[l];
              bytes += static_cast<double>(layers[l].parameter_bytes);
            }
            slowest = std::max(slowest, t);
            if (w > 1) sync = std::max(sync, 4.0 * (w - 1) * bytes / (w * cluster.link.bytes_per_s));
            if (s + 1 < p) {
              slowest = std::max(slowest, 2 * (cluster.link.latency_s +
                                               layers[end - 1].output_bytes * scale /
                                                   cluster.link.bytes_per_s));
            }
          }
          plan.step_time_s = m * slowest + std::max(0.0, sync - m * slowest);
          plan.samples_per_s = o.global_batch / plan.step_time_s;
          bool fits = true;
          for (int s = 0; s < p; ++s) {
            const int64_t need = TwoBWStageMemory(layers, plan, s, o.profiled_micro_batch);
            plan.stage_memory_bytes.push_back(need);
            if (cluster.memory_bytes > 0 && need > cluster.memory_bytes) {
              fits = false;
              if (need < miss_need) {
                miss_need = need;
                miss_stage = s;
              }
            }
          }
          if (!fits) continue;
          const auto peak = [](const TwoBWPlan& q) {
            return *std::max_element(q.stage_memory_bytes.begin(), q.stage_memory_bytes.end());
          };
          if (!best || plan.samples_per_s > best->samples_per_s * (1 + 1e-12) ||
              (plan.samples_per_s >= best->samples_per_s * (1 - 1e-12) && peak(plan) < peak(*best))) {
            best = std::move(plan);
          }
        }
      }
    }
  }
  if (!best) {
    if (miss_need == std::numeric_limits<int64_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "no layout: no micro-batch size divides the global batch ", o.global_batch,
          " into at least as many micro-batches as stages"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "does not fit: needs ", miss_need, " bytes on stage ", miss_stage, ", have ",
        cluster.memory_bytes, " (the plan that came closest)"));
  }
  return *best;
}

}  // namespace pipetrain::planner
