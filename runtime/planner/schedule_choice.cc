#include "runtime/planner/schedule_choice.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;

// Parts of at most `limit` each, greedily from layer 0 (the fewest there can be); none when
// a layer alone is above the limit.
std::vector<std::pair<int, int>> GreedyRanges(const std::vector<double>& cost, double limit) {
  std::vector<std::pair<int, int>> ranges;
  double sum = 0;
  int begin = 0;
  for (int l = 0; l < static_cast<int>(cost.size()); ++l) {
    if (cost[l] > limit) return {};
    if (l > begin && sum + cost[l] > limit) {
      ranges.emplace_back(begin, l);
      begin = l;
      sum = 0;
    }
    sum += cost[l];
  }
  if (!cost.empty()) ranges.emplace_back(begin, static_cast<int>(cost.size()));
  return ranges;
}

}  // namespace

std::vector<std::pair<int, int>> BalancedLayerRanges(const std::vector<LayerProfile>& layers,
                                                     int parts) {
  const int n = static_cast<int>(layers.size());
  if (parts < 1 || parts > n) return {};
  std::vector<double> cost(n);
  for (int l = 0; l < n; ++l) {
    cost[l] = std::max(1e-12, layers[l].forward_s + layers[l].backward_s);
  }
  double low = *std::max_element(cost.begin(), cost.end());
  double high = std::accumulate(cost.begin(), cost.end(), 0.0);
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (low + high);
    const std::vector<std::pair<int, int>> r = GreedyRanges(cost, mid);
    if (!r.empty() && static_cast<int>(r.size()) <= parts) {
      high = mid;
    } else {
      low = mid;
    }
  }
  std::vector<std::pair<int, int>> ranges = GreedyRanges(cost, high);
  // Fewer parts than asked: split the widest, its last layer a part of its own (no part
  // grows).
  while (static_cast<int>(ranges.size()) < parts) {
    auto widest = std::max_element(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
      return a.second - a.first < b.second - b.first;
    });
    const int end = widest->second;
    widest->second = end - 1;
    ranges.insert(widest + 1, {end - 1, end});
  }
  return ranges;
}

std::vector<ScheduleOption> CompareSchedules(const ModelProfile& profile,
                                             const ClusterProfile& cluster, const Layout& chosen) {
  const std::vector<LayerProfile> layers = LayersAt(profile, chosen.pipeline.micro_batch_size);
  const int p = chosen.stages();
  std::vector<ScheduleOption> options;
  for (const ScheduleKind kind : schedule::kScheduleKinds) {
    ScheduleOption option;
    option.schedule = kind;
    // The updates a schedule computes are its weight policy's: every flushing schedule the
    // un-pipelined step's, 2bw and pipedream each their own stale ones.
    option.same_semantics = schedule::WeightsOf(kind) == schedule::WeightsOf(chosen.schedule);
    Layout layout = chosen;
    layout.schedule = kind;
    const int v = schedule::DefaultVirtualStages(kind);
    if (schedule::HoldsChunks(kind)) {
      std::vector<std::pair<int, int>> ranges = BalancedLayerRanges(layers, v * p);
      if (ranges.empty()) {
        option.why = absl::StrCat("needs ", v * p, " model stages: the model has ", layers.size(),
                                  " layers");
        options.push_back(std::move(option));
        continue;
      }
      layout.SetModelStageLayers(std::move(ranges), v);
    } else if (schedule::HoldsChunks(chosen.schedule)) {
      layout.SetStageLayers(BalancedLayerRanges(layers, p));
    }
    layout.rank_hosts.clear();
    absl::StatusOr<Prediction> prediction = Predict(profile, cluster, layout);
    if (!prediction.ok()) {
      option.why = std::string(prediction.status().message());
      options.push_back(std::move(option));
      continue;
    }
    option.valid = true;
    option.candidate.layout = std::move(layout);
    option.candidate.prediction = *std::move(prediction);
    option.candidate.fits =
        cluster.memory_bytes <= 0 ||
        option.candidate.prediction.peak_memory_bytes <= PlannableBytes(cluster.memory_bytes);
    options.push_back(std::move(option));
  }
  // The fastest that fits among those with the chosen one's semantics.
  ScheduleOption* best = nullptr;
  for (ScheduleOption& o : options) {
    if (!o.valid || !o.candidate.fits || !o.same_semantics) continue;
    if (best == nullptr ||
        o.candidate.prediction.step_time_s < best->candidate.prediction.step_time_s * (1 - 1e-9)) {
      best = &o;
    }
  }
  for (ScheduleOption& o : options) {
    if (!o.valid) continue;  // its rule already said
    if (&o == best) {
      o.best = true;
    } else if (!o.candidate.fits) {
      o.why = absl::StrFormat("does not fit: peak %d bytes on a rank, %d plannable",
                              o.candidate.prediction.peak_memory_bytes,
                              PlannableBytes(cluster.memory_bytes));
    } else if (!o.same_semantics) {
      o.why = schedule::WeightsOf(o.schedule) == schedule::WeightPolicy::kFlush
                  ? "flushes every step: other updates than the chosen schedule's"
                  : "its own stale weights: other updates than the chosen schedule's";
    } else if (best != nullptr) {
      o.why = absl::StrFormat(
          "slower: step %.3f ms vs %.3f ms (%s)", o.candidate.prediction.step_time_s * 1e3,
          best->candidate.prediction.step_time_s * 1e3, schedule::ScheduleKindName(best->schedule));
    }
  }
  return options;
}

}  // namespace pipetrain::planner
