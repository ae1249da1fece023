// The PipeDream-2BW planner: without a memory cap it does not recompute; with a cap that
// forbids that plan, it recomputes (and fits); no chosen plan exceeds the memory it was given, on 200 random
// profiles and caps; a model that fits nowhere is a clear error.
#include "runtime/planner/twobw.h"

#include <algorithm>
#include <limits>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::planner {
namespace {

using ::testing::HasSubstr;

// 8 equal layers of 1 MB of weights (AdamW state 2 MB) that stash 8 MB each per micro-batch
// of 4 samples and hand on 1 MB.
std::vector<LayerProfile> Layers() {
  std::vector<LayerProfile> layers(8);
  for (LayerProfile& l : layers) {
    l.forward_s = 0.010;
    l.backward_s = 0.020;
    l.parameter_bytes = 1 << 20;
    l.optimizer_bytes = 2 << 20;
    l.stash_bytes = 8 << 20;
    l.output_bytes = 1 << 20;
  }
  return layers;
}

TEST(TwoBWPlanner, RecomputesWhenTheMemoryCapForbidsThePlanWithout) {
  const std::vector<LayerProfile> layers = Layers();
  TwoBWOptions options{4, 32, {1, 2, 4, 8}};
  ClusterProfile cluster{4, {1e-5, 1e9}, 0};
  absl::StatusOr<TwoBWPlan> free = PlanTwoBW(layers, cluster, options);
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_FALSE(free->recompute);  // recomputing costs a forward: never chosen for nothing
  // The smallest memory any plan without recomputation needs, then a cap just below it.
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (int64_t cap = int64_t{1} << 34; cap > (1 << 20); cap -= cap / 64) {
    cluster.memory_bytes = cap;
    absl::StatusOr<TwoBWPlan> plan = PlanTwoBW(layers, cluster, options);
    if (!plan.ok() || plan->recompute) break;
    smallest = cap;
  }
  ASSERT_LT(smallest, int64_t{1} << 34);
  cluster.memory_bytes = smallest - smallest / 64 - 1;
  absl::StatusOr<TwoBWPlan> capped = PlanTwoBW(layers, cluster, options);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_TRUE(capped->recompute);
  for (int64_t bytes : capped->stage_memory_bytes) EXPECT_LE(bytes, cluster.memory_bytes);
  // The cap forbids the plan chosen without one.
  EXPECT_GT(*std::max_element(free->stage_memory_bytes.begin(), free->stage_memory_bytes.end()),
            cluster.memory_bytes);
}

TEST(TwoBWPlanner, NoPlanExceedsTheMemoryItWasGiven) {
  std::mt19937_64 random(7);
  std::uniform_int_distribution<int> layer_count(1, 8), worker_count(1, 8), batch_pow(0, 5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int planned = 0, refused = 0;
  for (int trial = 0; trial < 200; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::vector<LayerProfile> layers(layer_count(random));
    for (LayerProfile& l : layers) {
      l.forward_s = 0.001 + unit(random) * 0.01;
      l.backward_s = 2 * l.forward_s;
      l.parameter_bytes = static_cast<int64_t>(unit(random) * (4 << 20));
      l.optimizer_bytes = 2 * l.parameter_bytes;
      l.stash_bytes = static_cast<int64_t>(unit(random) * (16 << 20));
      l.output_bytes = static_cast<int64_t>(unit(random) * (2 << 20));
    }
    ClusterProfile cluster{worker_count(random), {1e-5, 1e9},
                           static_cast<int64_t>(unit(random) * (64 << 20))};
    TwoBWOptions options{2, 2 << batch_pow(random), {}};
    absl::StatusOr<TwoBWPlan> plan = PlanTwoBW(layers, cluster, options);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      EXPECT_THAT(plan.status().message(), HasSubstr("does not fit: needs "));
      ++refused;
      continue;
    }
    ++planned;
    EXPECT_LE(plan->stages * plan->replicas, cluster.workers);
    EXPECT_EQ(plan->replicas * plan->micro_batch_size * plan->micro_batches, options.global_batch);
    EXPECT_GE(plan->micro_batches, plan->stages);
    ASSERT_EQ(static_cast<int>(plan->stage_memory_bytes.size()), plan->stages);
    for (int s = 0; s < plan->stages; ++s) {
      EXPECT_EQ(plan->stage_memory_bytes[s],
                TwoBWStageMemory(layers, *plan, s, options.profiled_micro_batch));
      EXPECT_LE(plan->stage_memory_bytes[s], cluster.memory_bytes);
    }
  }
  EXPECT_GT(planned, 50);
  EXPECT_GT(refused, 10);
}

TEST(TwoBWPlanner, AModelThatFitsNowhereIsAClearError) {
  std::vector<LayerProfile> layers = Layers();
  ClusterProfile cluster{2, {1e-5, 1e9}, 1 << 20};  // 1 MB: not even one layer's weights
  absl::StatusOr<TwoBWPlan> plan = PlanTwoBW(layers, cluster, TwoBWOptions{4, 8, {}});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("does not fit: needs "));
  EXPECT_THAT(plan.status().message(), HasSubstr(" bytes on stage "));
  EXPECT_THAT(plan.status().message(), HasSubstr(", have 1048576"));
  EXPECT_EQ(PlanTwoBW({}, cluster, TwoBWOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::planner
