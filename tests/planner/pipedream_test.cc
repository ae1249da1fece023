// PipeDream's partitioner: the dynamic program against every plan, on 300 random profiles;
// hand-checked cases where pipelining wins (big weights) and where replication wins (big
// activations); bad input.
#include "runtime/planner/pipedream.h"

#include <cmath>
#include <limits>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::planner {
namespace {

using ::testing::HasSubstr;

// The plan covers the layers in order with contiguous stages, uses exactly `workers`, and
// its times are what StageTime and BoundaryTime say.
void ExpectValid(const PipeDreamPlan& plan, const std::vector<LayerProfile>& layers,
                 const ClusterProfile& cluster) {
  ASSERT_FALSE(plan.stages.empty());
  int next = 0, workers = 0;
  double slowest = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlannedStage& st = plan.stages[s];
    EXPECT_EQ(st.begin, next);
    EXPECT_LT(st.begin, st.end);
    EXPECT_GE(st.replicas, 1);
    EXPECT_DOUBLE_EQ(st.time_s, StageTime(layers, st.begin, st.end, st.replicas, cluster.link));
    slowest = std::max(slowest, st.time_s);
    if (s + 1 < plan.stages.size()) {
      slowest = std::max(slowest, BoundaryTime(layers, st.end - 1, cluster.link));
    }
    next = st.end;
    workers += st.replicas;
  }
  EXPECT_EQ(next, static_cast<int>(layers.size()));
  EXPECT_EQ(workers, cluster.workers);
  EXPECT_DOUBLE_EQ(plan.slowest_s, slowest);
}

// `n` layers with times in [1, 100] ms and bytes from 1 KB to 1 GB (log-uniform).
std::vector<LayerProfile> RandomLayers(std::mt19937_64& random, int n) {
  std::uniform_real_distribution<double> seconds(0.001, 0.1), log_bytes(3, 9);
  std::vector<LayerProfile> layers(n);
  for (LayerProfile& l : layers) {
    l.forward_s = seconds(random);
    l.backward_s = 2 * seconds(random);
    l.output_bytes = static_cast<int64_t>(std::pow(10, log_bytes(random)));
    l.parameter_bytes = static_cast<int64_t>(std::pow(10, log_bytes(random)));
  }
  return layers;
}

TEST(PipeDreamPlanner, EqualsBruteForceOnRandomProfiles) {
  std::mt19937_64 random(20261125);
  std::uniform_real_distribution<double> seconds(0.001, 0.1);
  std::uniform_int_distribution<int> layer_count(1, 7), worker_count(1, 6);
  int pipelined = 0, replicated = 0;
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::vector<LayerProfile> layers = RandomLayers(random, layer_count(random));
    ClusterProfile cluster;
    cluster.workers = worker_count(random);
    cluster.link = {1e-4 * seconds(random), std::pow(10, 8 + 2 * seconds(random) * 10)};
    absl::StatusOr<PipeDreamPlan> planned = PlanPipeDream(layers, cluster);
    absl::StatusOr<PipeDreamPlan> brute = BruteForcePipeDream(layers, cluster);
    ASSERT_TRUE(planned.ok() && brute.ok());
    ExpectValid(*planned, layers, cluster);
    ExpectValid(*brute, layers, cluster);
    EXPECT_NEAR(planned->slowest_s, brute->slowest_s, 1e-12 * brute->slowest_s);
    pipelined += planned->stages.size() > 1;
    replicated += std::any_of(planned->stages.begin(), planned->stages.end(),
                              [](const PlannedStage& s) { return s.replicas > 1; });
  }
  // The profiles exercise both kinds of plan.
  EXPECT_GT(pipelined, 30);
  EXPECT_GT(replicated, 30);
}

// Two layers of 1 s (forward + backward) each, 2 workers, a link of 1 GB/s.
TEST(PipeDreamPlanner, BigWeightsArePipelinedAndBigActivationsReplicated) {
  std::vector<LayerProfile> layers(2);
  for (LayerProfile& l : layers) {
    l.forward_s = 0.25;
    l.backward_s = 0.75;
  }
  ClusterProfile cluster{2, {0.0, 1e9}};
  // 10 GB of weights per layer: replicating costs sync = 4 (2 - 1) 20e9 / (2e9) = 40 s > 2 s
  // of compute, so T = 20 s; two stages of one layer: max(1, 1, C = 2 x 1e3 / 1e9).
  for (LayerProfile& l : layers) {
    l.parameter_bytes = 10'000'000'000;
    l.output_bytes = 1'000;
  }
  absl::StatusOr<PipeDreamPlan> plan = PlanPipeDream(layers, cluster);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[0].end, 1);
  EXPECT_DOUBLE_EQ(plan->slowest_s, 1.0);
  // 1 KB of weights and 10 GB activations: one stage on both workers, T = 2 s / 2 = 1 s
  // (sync 4 x 2e3 / 2e9); a split would send 2 x 10 s of activations per mini-batch.
  for (LayerProfile& l : layers) {
    l.parameter_bytes = 1'000;
    l.output_bytes = 10'000'000'000;
  }
  plan = PlanPipeDream(layers, cluster);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->stages.size(), 1u);
  EXPECT_EQ(plan->stages[0].replicas, 2);
  EXPECT_DOUBLE_EQ(plan->slowest_s, 1.0);
}

// The uniform-replica partition (what pipetrain runs: every stage on w replicas) against
// every split of the layers into exactly p contiguous stages.
TEST(PipeDreamPlanner, UniformReplicaPartitionEqualsBruteForce) {
  std::mt19937_64 random(11);
  std::uniform_real_distribution<double> seconds(0.001, 0.1);
  std::uniform_int_distribution<int> layer_count(1, 9), replica_count(1, 4);
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::vector<LayerProfile> layers = RandomLayers(random, layer_count(random));
    const LinkProfile link{1e-4 * seconds(random), std::pow(10, 8 + 20 * seconds(random))};
    const int L = static_cast<int>(layers.size());
    const int p = 1 + static_cast<int>(random() % L), w = replica_count(random);
    absl::StatusOr<PipeDreamPlan> plan = PartitionPipeDream(layers, p, w, link);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(static_cast<int>(plan->stages.size()), p);
    // Every choice of p - 1 cut points among the L - 1 gaps.
    double brute = std::numeric_limits<double>::infinity();
    for (uint32_t cuts = 0; cuts < (1u << (L - 1)); ++cuts) {
      if (__builtin_popcount(cuts) != p - 1) continue;
      double slowest = 0;
      int begin = 0;
      for (int l = 0; l < L; ++l) {
        const bool last = l == L - 1 || (cuts >> l & 1u);
        if (!last) continue;
        slowest = std::max(slowest, StageTime(layers, begin, l + 1, w, link));
        if (l < L - 1) slowest = std::max(slowest, BoundaryTime(layers, l, link));
        begin = l + 1;
      }
      brute = std::min(brute, slowest);
    }
    EXPECT_NEAR(plan->slowest_s, brute, 1e-12 * brute);
    int next = 0;
    double slowest = 0;
    for (size_t s = 0; s < plan->stages.size(); ++s) {
      const PlannedStage& st = plan->stages[s];
      EXPECT_EQ(st.begin, next);
      EXPECT_EQ(st.replicas, w);
      slowest = std::max(slowest, StageTime(layers, st.begin, st.end, w, link));
      if (s + 1 < plan->stages.size())
        slowest = std::max(slowest, BoundaryTime(layers, st.end - 1, link));
      next = st.end;
    }
    EXPECT_EQ(next, L);
    EXPECT_DOUBLE_EQ(slowest, plan->slowest_s);
  }
  EXPECT_FALSE(PartitionPipeDream(std::vector<LayerProfile>(2), 3, 1, {0, 1}).ok());
}

TEST(PipeDreamPlanner, BadInputIsRefused) {
  EXPECT_THAT(PlanPipeDream({}, ClusterProfile{}).status().message(), HasSubstr("no layers"));
  std::vector<LayerProfile> one(1);
  EXPECT_THAT(PlanPipeDream(one, ClusterProfile{0, {}}).status().message(),
              HasSubstr("workers: at least 1, got 0"));
  EXPECT_THAT(PlanPipeDream(one, ClusterProfile{1, {0, 0}}).status().message(),
              HasSubstr("bandwidth must be positive"));
}

}  // namespace
}  // namespace pipetrain::planner
