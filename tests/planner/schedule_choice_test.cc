// The schedules with chunks in the simulation, and the choice among every schedule:
// - interleaved's predicted step is the independent compute-list simulator's makespan
//   (runtime/schedule/compute_lists.h) plus rank 0's update, for p = 2 and 4, v = 2, 3
//   (1F1B's prediction for the same layers differs: the check can fail);
// - a rank's weights are those of its model stages; more chunks in flight cost memory;
// - BalancedLayerRanges equals brute force on random costs;
// - CompareSchedules marks the fastest flushing schedule that fits, says why each other
//   lost (slower, memory, another semantics, a rule), and never picks a stale one for a
//   flushing plan.
#include "runtime/planner/schedule_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/schedule/compute_lists.h"
#include "tests/planner/even_layout.h"

namespace pipetrain::planner {
namespace {

using schedule::ScheduleKind;
using ::testing::HasSubstr;

// `layers` layers over v x p model stages, evenly.
Layout Chunked(ScheduleKind kind, int layers, int p, int v, int m) {
  Layout layout = Even(kind, layers, p * v, m);
  std::vector<std::pair<int, int>> ranges = layout.pipeline.stage_layers;
  layout.SetModelStageLayers(std::move(ranges), v);
  return layout;
}

TEST(PredictSchedulesWithChunks, InterleavedStepIsTheComputeListsMakespanPlusTheUpdate) {
  for (const int p : {2, 4}) {
    for (const int v : {2, 3}) {
      const int m = 2 * p, layers = 2 * p * v;
      SCOPED_TRACE(absl::StrCat("p=", p, " v=", v));
      const double f = 0.01, opt = 0.001;
      const ModelProfile profile = Uniform(layers, f, opt);
      const Layout layout = Chunked(ScheduleKind::kInterleaved, layers, p, v, m);
      absl::StatusOr<Prediction> predicted = Predict(profile, FreeLinks(), layout);
      ASSERT_TRUE(predicted.ok()) << predicted.status();
      schedule::ScheduleParams params{ScheduleKind::kInterleaved, p, m, 1};
      params.virtual_stages = v;
      absl::StatusOr<std::vector<std::vector<schedule::Action>>> lists =
          schedule::BuildComputeLists(params);
      ASSERT_TRUE(lists.ok()) << lists.status();
      schedule::ComputeCosts costs;
      costs.forward = 2 * f;  // two layers a model stage
      costs.backward = 4 * f;
      absl::StatusOr<schedule::ComputeSimulation> sim =
          schedule::SimulateComputeLists(schedule::LayoutOf(params), m, *lists, costs);
      ASSERT_TRUE(sim.ok()) << sim.status();
      // Rank 0 runs stage 0's last backward, the step's last action, then its v stages'
      // updates (2 layers each).
      EXPECT_NEAR(predicted->step_time_s, sim->makespan + v * 2 * opt, 1e-9);
      // 1F1B over the same layers (one stage a rank) is another prediction.
      absl::StatusOr<Prediction> one_f_one_b =
          Predict(profile, FreeLinks(), Even(ScheduleKind::kOneFOneB, layers, p, m));
      ASSERT_TRUE(one_f_one_b.ok());
      EXPECT_GT(std::abs(one_f_one_b->step_time_s - predicted->step_time_s), 1e-3);
    }
  }
}

TEST(PredictSchedulesWithChunks, ARankHoldsTheWeightsOfItsModelStagesAndTheirMicroBatches) {
  const ModelProfile profile = Uniform(8, 0.01, 0, 1000);
  for (const ScheduleKind kind : schedule::kScheduleKinds) {
    if (!schedule::HoldsChunks(kind)) continue;
    SCOPED_TRACE(std::string(schedule::ScheduleKindName(kind)));
    const int v = schedule::DefaultVirtualStages(kind);
    absl::StatusOr<Prediction> p = Predict(profile, FreeLinks(), Chunked(kind, 8, 2, v, 4));
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->stages.size(), 2u);  // per rank
    for (const StagePrediction& rank : p->stages) {
      // 4 layers a rank, each 1000 parameter bytes and 2000 of optimizer state.
      EXPECT_EQ(rank.weight_bytes, 4 * 3000);
      EXPECT_GE(rank.peak_in_flight, 1);
      // At least its micro-batches in flight (400 + 100 a layer kept), each 8 / (2 v)
      // layers; and at its step's last backward every gradient (4 layers) with that
      // micro-batch's layers kept. At most all of that at once, each micro-batch with its
      // received input (100) and one layer's working memory (50).
      const int64_t kept = (8 / (2 * v)) * 500;
      EXPECT_GE(rank.activation_bytes, rank.peak_in_flight * kept);
      EXPECT_GE(rank.activation_bytes, 4 * 1000 + kept);
      EXPECT_LE(rank.activation_bytes, rank.peak_in_flight * (kept + 100) + 4 * 1000 + 50);
      EXPECT_EQ(rank.peak_memory_bytes, rank.weight_bytes + rank.activation_bytes);
    }
  }
  // A wrong count of ranges is refused.
  Layout bad = Chunked(ScheduleKind::kInterleaved, 8, 2, 2, 4);
  bad.virtual_stages = 3;
  EXPECT_FALSE(Predict(profile, FreeLinks(), bad).ok());
}

// The smallest largest part over every split of `cost` into `parts` contiguous parts.
double BruteForceLargestPart(const std::vector<double>& cost, int parts, size_t from = 0) {
  if (parts == 1) {
    double sum = 0;
    for (size_t i = from; i < cost.size(); ++i) sum += cost[i];
    return sum;
  }
  double best = std::numeric_limits<double>::infinity(), sum = 0;
  for (size_t end = from + 1; end + parts - 1 <= cost.size(); ++end) {
    sum += cost[end - 1];
    best = std::min(best, std::max(sum, BruteForceLargestPart(cost, parts - 1, end)));
  }
  return best;
}

TEST(BalancedLayerRanges, EqualsBruteForce) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> time(0.001, 0.01);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + static_cast<int>(random() % 9);
    const int parts = 1 + static_cast<int>(random() % n);
    std::vector<LayerProfile> layers(n);
    std::vector<double> cost(n);
    for (int l = 0; l < n; ++l) {
      layers[l].forward_s = time(random);
      layers[l].backward_s = time(random);
      cost[l] = layers[l].forward_s + layers[l].backward_s;
    }
    const std::vector<std::pair<int, int>> ranges = BalancedLayerRanges(layers, parts);
    ASSERT_EQ(static_cast<int>(ranges.size()), parts);
    double largest = 0;
    int next = 0;
    for (const auto& [begin, end] : ranges) {
      ASSERT_EQ(begin, next);
      ASSERT_LT(begin, end);
      double sum = 0;
      for (int l = begin; l < end; ++l) sum += cost[l];
      largest = std::max(largest, sum);
      next = end;
    }
    EXPECT_EQ(next, n);
    EXPECT_NEAR(largest, BruteForceLargestPart(cost, parts), 1e-9) << "trial " << trial;
  }
  EXPECT_TRUE(BalancedLayerRanges(std::vector<LayerProfile>(3), 4).empty());
}

TEST(CompareSchedules, MarksTheFastestFlushingScheduleThatFitsAndSaysWhyOthersLost) {
  const ModelProfile profile = Uniform(8, 0.01, 0, 1000);
  ClusterProfile cluster = FreeLinks();
  const Layout chosen = Even(ScheduleKind::kOneFOneB, 8, 2, 2);  // m = 2 < 2p: no dualpipev
  const std::vector<ScheduleOption> options = CompareSchedules(profile, cluster, chosen);
  ASSERT_EQ(options.size(), 8u);
  const ScheduleOption* best = nullptr;
  for (const ScheduleOption& o : options) {
    SCOPED_TRACE(std::string(schedule::ScheduleKindName(o.schedule)));
    if (o.best) {
      ASSERT_EQ(best, nullptr);
      best = &o;
    }
    if (o.schedule == ScheduleKind::kDualPipeV) {
      EXPECT_FALSE(o.valid);
      EXPECT_THAT(o.why, HasSubstr("dualpipev needs microbatches >= 2 x stages"));
    }
    if (o.schedule == ScheduleKind::kTwoBW || o.schedule == ScheduleKind::kPipeDream) {
      EXPECT_FALSE(o.same_semantics);
      EXPECT_THAT(o.why, HasSubstr("other updates"));
    }
  }
  ASSERT_NE(best, nullptr);
  EXPECT_TRUE(best->same_semantics);
  EXPECT_TRUE(best->why.empty());
  for (const ScheduleOption& o : options) {
    if (!o.valid || &o == best || !o.same_semantics) continue;
    EXPECT_GE(o.candidate.prediction.step_time_s, best->candidate.prediction.step_time_s);
    EXPECT_THAT(o.why, HasSubstr("slower"));
  }
  // Memory for the fastest alone: it no longer fits, another is marked.
  cluster.memory_bytes =
      static_cast<int64_t>(best->candidate.prediction.peak_memory_bytes / kPlannableMemoryShare) -
      1;
  const std::vector<ScheduleOption> tight = CompareSchedules(profile, cluster, chosen);
  for (const ScheduleOption& o : tight) {
    if (o.schedule == best->schedule) {
      EXPECT_FALSE(o.best);
      EXPECT_THAT(o.why, HasSubstr("does not fit"));
    }
  }
  // A plan of 2BW keeps 2BW: no flushing schedule stands in for it.
  const std::vector<ScheduleOption> stale =
      CompareSchedules(profile, FreeLinks(), Even(ScheduleKind::kTwoBW, 8, 2, 2));
  for (const ScheduleOption& o : stale) {
    EXPECT_EQ(o.best, o.schedule == ScheduleKind::kTwoBW) << schedule::ScheduleKindName(o.schedule);
  }
}

}  // namespace
}  // namespace pipetrain::planner
