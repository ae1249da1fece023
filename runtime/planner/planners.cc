#include "runtime/planner/planners.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/model/partition.h"
#include "runtime/planner/host_placement.h"
#include "runtime/planner/pipedream.h"

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;

// Hippie's prefixes of the greedy order considered at most (evenly spaced beyond that).
constexpr int kMaxRecomputePrefixes = 32;

std::vector<std::pair<int, int>> ToPairs(const std::vector<model::LayerRange>& ranges) {
  std::vector<std::pair<int, int>> pairs;
  for (const model::LayerRange& r : ranges) pairs.emplace_back(r.begin, r.end);
  return pairs;
}

// Layers split into p stages by compute (forward + backward, + forward when recomputed).
absl::StatusOr<std::vector<std::pair<int, int>>> SplitByCompute(
    const std::vector<LayerProfile>& layers, int p, const std::vector<bool>& recompute) {
  std::vector<double> cost;
  for (size_t l = 0; l < layers.size(); ++l) {
    const bool again = l < recompute.size() && recompute[l];
    cost.push_back(layers[l].forward_s * (again ? 2 : 1) + layers[l].backward_s);
  }
  absl::StatusOr<std::vector<model::LayerRange>> split = model::BalancedPartition(cost, p);
  if (!split.ok()) return split.status();
  return ToPairs(*split);
}

double Objective(PlannerKind planner, const Candidate& c) {
  return planner == PlannerKind::kHippie ? c.memory_efficiency : c.prediction.samples_per_s;
}

// a is better than b: fitting first; among misses the smaller peak; else the objective, then
// the smaller peak.
bool Better(PlannerKind planner, const Candidate& a, const Candidate& b) {
  if (a.fits != b.fits) return a.fits;
  const int64_t peak_a = a.prediction.peak_memory_bytes, peak_b = b.prediction.peak_memory_bytes;
  if (!a.fits) return peak_a < peak_b;
  const double oa = Objective(planner, a), ob = Objective(planner, b);
  if (oa > ob * (1 + 1e-9)) return true;
  if (ob > oa * (1 + 1e-9)) return false;
  return peak_a < peak_b;
}

std::string DoesNotFit(const Candidate& c, int64_t memory) {
  int worst = 0;
  const std::vector<StagePrediction>& stages = c.prediction.stages;
  for (int s = 1; s < static_cast<int>(stages.size()); ++s) {
    if (stages[s].peak_memory_bytes > stages[worst].peak_memory_bytes) worst = s;
  }
  return absl::StrCat("does not fit: needs ", stages[worst].peak_memory_bytes, " bytes on stage ",
                      worst, ", have ", PlannableBytes(memory), " (",
                      static_cast<int>(std::lround(100 * kPlannableMemoryShare)), "% of ", memory,
                      ")");
}

std::string Shape(const Layout& l) {
  return absl::StrCat("p=", l.stages(), " w=", l.pipeline.replicas,
                      " b=", l.pipeline.micro_batch_size, " m=", l.pipeline.micro_batches);
}

}  // namespace

std::string_view PlannerKindName(PlannerKind kind) {
  switch (kind) {
    case PlannerKind::kTwoBW: return "2bw";
    case PlannerKind::kPipeDream: return "pipedream";
    case PlannerKind::kHippie: return "hippie";
  }
  return "?";
}

absl::StatusOr<PlannerKind> ParsePlannerKind(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  for (PlannerKind k : {PlannerKind::kTwoBW, PlannerKind::kPipeDream, PlannerKind::kHippie}) {
    if (lower == PlannerKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown planner '", std::string(name), "' (one of: 2bw, pipedream, hippie)"));
}

std::vector<int> HippieRecomputeOrder(const std::vector<LayerProfile>& layers) {
  std::vector<int> order;
  for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
    if (layers[l].stash_bytes > 0) order.push_back(l);
  }
  const auto saved_per_second = [&](int l) {
    return static_cast<double>(layers[l].stash_bytes) / std::max(layers[l].forward_s, 1e-12);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return saved_per_second(a) > saved_per_second(b); });
  return order;
}

namespace {

// The gradient AllReduce of a layout with replicas: stage 0 overlapping it with its last
// backward in buckets of 1, 4, 16 or 64 MiB, or averaging after its backward, whichever the
// simulation finds fastest (a bucket is a collective with a fixed cost; on cores that are all
// computing, an overlapped AllReduce takes its CPU from the backward). Ties keep the
// layout's own setting. The memory does not depend on it.
absl::Status ChooseGradientAllReduce(const ModelProfile& profile, const ClusterProfile& cluster,
                                     Candidate& chosen) {
  if (chosen.layout.pipeline.replicas < 2) return absl::OkStatus();
  std::vector<Layout> options;
  Layout off = chosen.layout;
  off.overlap_allreduce = false;
  options.push_back(off);
  for (const int64_t mib : {1, 4, 16, 64}) {
    Layout on = chosen.layout;
    on.overlap_allreduce = true;
    on.bucket_bytes = mib << 20;
    options.push_back(on);
  }
  for (Layout& layout : options) {
    absl::StatusOr<Prediction> p = Predict(profile, cluster, layout);
    if (!p.ok()) return p.status();
    if (p->step_time_s < chosen.prediction.step_time_s * (1 - 1e-9)) {
      const double rate_ratio = p->samples_per_s / chosen.prediction.samples_per_s;
      chosen.layout = std::move(layout);
      chosen.prediction = *std::move(p);
      chosen.memory_efficiency *= rate_ratio;
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t PlannableBytes(int64_t memory_bytes) {
  return memory_bytes <= 0
             ? memory_bytes
             : static_cast<int64_t>(kPlannableMemoryShare * static_cast<double>(memory_bytes));
}

absl::StatusOr<PlanResult> MakePlan(const ModelProfile& profile, const ClusterProfile& cluster,
                                    const PlanRequest& request) {
  if (profile.sizes.empty() || profile.sizes.front().layers.empty()) {
    return absl::InvalidArgumentError("the profile has no layers");
  }
  if (cluster.workers < 1 || request.global_batch < 1 || !(cluster.link.bytes_per_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers, the global batch and the link's bandwidth must be positive: got ",
                     cluster.workers, " workers, global batch ", request.global_batch));
  }
  if (const int on_hosts =
          std::accumulate(cluster.host_workers.begin(), cluster.host_workers.end(), 0);
      cluster.hosts() > 1 && on_hosts != cluster.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the hosts have ", on_hosts, " workers; the cluster has ", cluster.workers));
  }
  const int L = static_cast<int>(profile.sizes.front().layers.size());
  const int N = cluster.workers, B = request.global_batch;
  std::vector<int> sizes = request.micro_batch_sizes;
  if (sizes.empty()) {
    for (int b = 1; b <= B; ++b) {
      if (B % b == 0) sizes.push_back(b);
    }
  }

  PlanResult result;
  result.planner = request.planner;
  const auto thread_cpu = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return absl::DurationFromTimespec(ts);
  };
  const absl::Duration cpu_start = thread_cpu();
  const auto evaluate = [&](Layout layout) -> absl::StatusOr<Candidate> {
    if (thread_cpu() - cpu_start > request.cpu_budget || absl::Now() > request.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "planning stopped after ", result.considered, " layouts: over its budget of ",
          absl::FormatDuration(request.cpu_budget), " of CPU",
          request.deadline == absl::InfiniteFuture() ? "" : " or its deadline",
          " (plan for fewer workers or micro-batch sizes, or give the stages)"));
    }
    layout.bucket_bytes = request.bucket_bytes;
    if (request.planner != PlannerKind::kHippie)
      layout.overlap_allreduce = request.overlap_allreduce;
    absl::StatusOr<Prediction> prediction;
    if (cluster.hosts() > 1) {  // the layout on its fastest placement on the hosts
      absl::StatusOr<std::vector<HostPlacement>> placements =
          RankHostPlacements(profile, cluster, layout);
      if (!placements.ok()) return placements.status();
      layout.rank_hosts = placements->front().rank_hosts;
      prediction = std::move(placements->front().prediction);
    } else {
      prediction = Predict(profile, cluster, layout);
    }
    if (!prediction.ok()) return prediction.status();
    ++result.considered;
    Candidate c;
    c.layout = std::move(layout);
    c.prediction = *std::move(prediction);
    c.fits = cluster.memory_bytes <= 0 ||
             c.prediction.peak_memory_bytes <= PlannableBytes(cluster.memory_bytes);
    return c;
  };

  // The data-parallel reference of ME.
  int w_dp = 1;
  for (int w = 1; w <= N; ++w) {
    if (B % w == 0) w_dp = w;
  }
  {
    Layout dp;
    dp.schedule = ScheduleKind::kOneFOneB;
    dp.SetStageLayers({{0, L}});
    dp.pipeline.replicas = w_dp;
    dp.pipeline.micro_batch_size = B / w_dp;
    dp.pipeline.micro_batches = 1;
    absl::StatusOr<Candidate> c = evaluate(std::move(dp));
    if (!c.ok()) return c.status();
    if (absl::Status s = ChooseGradientAllReduce(profile, cluster, *c); !s.ok()) return s;
    result.data_parallel = *std::move(c);
    result.data_parallel.memory_efficiency = 1.0;
  }
  const double dp_rate = result.data_parallel.prediction.samples_per_s;
  const double dp_memory = static_cast<double>(result.data_parallel.prediction.peak_memory_bytes);

  std::map<std::pair<int, int>, Candidate> best_of_shape;
  const auto consider = [&](Layout layout) -> absl::Status {
    absl::StatusOr<Candidate> c = evaluate(std::move(layout));
    if (!c.ok()) return c.status();
    c->memory_efficiency = (c->prediction.samples_per_s / dp_rate) /
                           (static_cast<double>(c->prediction.peak_memory_bytes) / dp_memory);
    const std::pair<int, int> shape{c->layout.stages(), c->layout.pipeline.replicas};
    auto it = best_of_shape.find(shape);
    if (it == best_of_shape.end()) {
      best_of_shape.emplace(shape, *std::move(c));
    } else if (Better(request.planner, *c, it->second)) {
      it->second = *std::move(c);
    }
    return absl::OkStatus();
  };

  for (int p = 1; p <= std::min(L, N); ++p) {
    for (int w = 1; p * w <= N; ++w) {
      for (int b : sizes) {
        if (b < 1 || B % (w * b) != 0) continue;
        const int m = B / (w * b);
        if (m > request.max_micro_batches) continue;  // bounds each simulation's work
        Layout base;
        base.pipeline.replicas = w;
        base.pipeline.micro_batch_size = b;
        base.pipeline.micro_batches = m;
        const std::vector<LayerProfile> layers = LayersAt(profile, b);
        switch (request.planner) {
          case PlannerKind::kTwoBW: {
            if (m < p) break;  // 2BW needs m >= p
            base.schedule = ScheduleKind::kTwoBW;
            for (bool recompute : {false, true}) {
              Layout layout = base;
              if (recompute) layout.recompute.assign(L, true);
              absl::StatusOr<std::vector<std::pair<int, int>>> split =
                  SplitByCompute(layers, p, layout.recompute);
              if (!split.ok()) return split.status();
              layout.SetStageLayers(*std::move(split));
              if (absl::Status s = consider(std::move(layout)); !s.ok()) return s;
            }
            break;
          }
          case PlannerKind::kPipeDream: {
            base.schedule = ScheduleKind::kOneFOneB;
            absl::StatusOr<PipeDreamPlan> split = PartitionPipeDream(layers, p, w, cluster.link);
            if (!split.ok()) return split.status();
            std::vector<std::pair<int, int>> stage_layers;
            for (const PlannedStage& stage : split->stages) {
              stage_layers.emplace_back(stage.begin, stage.end);
            }
            base.SetStageLayers(std::move(stage_layers));
            if (absl::Status s = consider(std::move(base)); !s.ok()) return s;
            break;
          }
          case PlannerKind::kHippie: {
            base.schedule = ScheduleKind::kOneFOneB;
            base.overlap_allreduce = true;
            absl::StatusOr<std::vector<std::pair<int, int>>> split = SplitByCompute(layers, p, {});
            if (!split.ok()) return split.status();
            base.SetStageLayers(*std::move(split));
            const std::vector<int> order = HippieRecomputeOrder(layers);
            const int n = static_cast<int>(order.size());
            const int stride = std::max(1, (n + kMaxRecomputePrefixes - 1) / kMaxRecomputePrefixes);
            for (int k = 0; k <= n; k = k == n ? n + 1 : std::min(n, k + stride)) {
              Layout layout = base;
              if (k > 0) {
                layout.recompute.assign(L, false);
                for (int i = 0; i < k; ++i) layout.recompute[order[i]] = true;
              }
              if (absl::Status s = consider(std::move(layout)); !s.ok()) return s;
            }
            break;
          }
        }
      }
    }
  }
  if (best_of_shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no layout: no micro-batch size divides the global batch ", B, " into ",
        request.planner == PlannerKind::kTwoBW ? "at least as many micro-batches as stages"
                                               : "micro-batches",
        " on ", N, " workers"));
  }
  std::vector<Candidate> ranked;
  for (auto& [shape, c] : best_of_shape) {
    if (absl::Status s = ChooseGradientAllReduce(profile, cluster, c); !s.ok()) return s;
    ranked.push_back(std::move(c));
  }
  std::stable_sort(ranked.begin(), ranked.end(), [&](const Candidate& a, const Candidate& b) {
    return Better(request.planner, a, b);
  });
  if (!ranked.front().fits) {
    return absl::ResourceExhaustedError(
        absl::StrCat(DoesNotFit(ranked.front(), cluster.memory_bytes),
                     " (the layout that came closest: ", Shape(ranked.front().layout), ")"));
  }
  result.chosen = std::move(ranked.front());
  const double best = Objective(request.planner, result.chosen);
  for (size_t i = 1; i < ranked.size(); ++i) {
    Candidate& c = ranked[i];
    if (!c.fits) {
      c.why = DoesNotFit(c, cluster.memory_bytes);
    } else if (request.planner == PlannerKind::kHippie) {
      c.why = absl::StrFormat("lower memory efficiency: %.3f vs %.3f", c.memory_efficiency, best);
    } else {
      c.why = absl::StrFormat("%.1f%% lower throughput: %.4g vs %.4g samples/s",
                              100.0 * (1.0 - c.prediction.samples_per_s / best),
                              c.prediction.samples_per_s, best);
    }
    if (std::abs(Objective(request.planner, c) - best) <= best * 1e-9 && c.fits) {
      c.why = absl::StrCat("as good, more memory: ", c.prediction.peak_memory_bytes, " vs ",
                           result.chosen.prediction.peak_memory_bytes, " bytes");
    }
    result.alternatives.push_back(std::move(c));
  }
  return result;
}

}  // namespace pipetrain::planner
