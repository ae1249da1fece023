// Placement as pure functions: FIFO with backfill, cores, devices; the layouts a recovering
// job may restart with; survivors kept on the stages whose state they hold.
// The coordinator's rules without processes, sockets or sleeps (coordinator_fixture.h); the
// daemon tests (tests/daemons) check the same rules end to end over gRPC.
#include "tests/coordinator/coordinator_fixture.h"

namespace pipetrain::coordinator::core_test {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> WaitingIds(const PlacementPlan& plan) {
  std::vector<std::string> ids;
  for (const Waiting& w : plan.waiting) ids.push_back(w.job_id);
  return ids;
}

TEST(Placement, JobsInOrderWithBackfill) {
  const PlacementPlan plan =
      PlaceQueuedJobs({{"a", 2}, {"b", 3}, {"c", 1}, {"d", 1}}, {{"w1"}, {"w2"}, {"w3"}, {"w4"}});
  ASSERT_EQ(plan.started.size(), 3u);
  EXPECT_EQ(plan.started[0].job_id, "a");
  EXPECT_EQ(plan.started[0].rank_workers, (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(plan.started[1].job_id, "c");  // b does not fit in the 2 left; c and d do
  EXPECT_EQ(plan.started[1].rank_workers, (std::vector<std::string>{"w3"}));
  EXPECT_EQ(plan.started[2].job_id, "d");
  EXPECT_EQ(WaitingIds(plan), (std::vector<std::string>{"b"}));
  EXPECT_EQ(plan.waiting[0].reason, "needs 3 workers, 2 idle (2 more taken by earlier jobs)");
  const PlacementPlan none = PlaceQueuedJobs({{"a", 1}}, {});
  EXPECT_EQ(WaitingIds(none), (std::vector<std::string>{"a"}));
  EXPECT_EQ(none.waiting[0].reason,
            "needs 1 worker; the pool has 0: it waits for more to register");
}

// threads_per_stage is a machine-bound field: a job runs only on workers with at least that
// many cores (or that did not say), and one the pool cannot hold says so while it waits.
TEST(Placement, ThreadsPerStageNeedWorkersWithThatManyCores) {
  const std::vector<PoolWorker> pool = {
      {"small1", 2}, {"big1", 16}, {"small2", 2}, {"busy-big", 16, /*idle=*/false}, {"unknown", 0}};
  PlacementPlan plan = PlaceQueuedJobs({{"a", 2, 8}, {"b", 2, 0}}, pool);
  ASSERT_EQ(plan.started.size(), 2u);
  EXPECT_EQ(plan.started[0].rank_workers, (std::vector<std::string>{"big1", "unknown"}));
  EXPECT_EQ(plan.started[1].rank_workers, (std::vector<std::string>{"small1", "small2"}));
  // Three 8-core ranks: the pool has three such workers, one busy -> waits for it.
  plan = PlaceQueuedJobs({{"c", 3, 8}}, pool);
  ASSERT_EQ(WaitingIds(plan), (std::vector<std::string>{"c"}));
  EXPECT_EQ(plan.waiting[0].reason,
            "needs 3 workers with at least 8 cores (threads_per_stage), 2 idle");
  // Four: more than the pool has, whatever finishes.
  plan = PlaceQueuedJobs({{"d", 4, 8}}, pool);
  ASSERT_EQ(WaitingIds(plan), (std::vector<std::string>{"d"}));
  EXPECT_EQ(plan.waiting[0].reason,
            "needs 4 workers with at least 8 cores (threads_per_stage); the pool has 3 such "
            "(of 5): it waits for more to register");
}

// A job runs only on workers of its device kind: a cuda job on workers registered as cuda or
// cuda:N, a cpu job never on them; a cuda job with no GPU workers waits, saying so.
TEST(Placement, JobsRunOnlyOnWorkersOfTheirDevice) {
  const std::vector<PoolWorker> pool = {{"cpu1", 0, true, "cpu"},
                                        {"gpu0", 0, true, "cuda:0"},
                                        {"cpu2", 0, true, "cpu"},
                                        {"gpu1", 0, true, "cuda"}};
  PlacementPlan plan = PlaceQueuedJobs({{"g", 2, 0, "cuda"}, {"c", 2, 0, "cpu"}}, pool);
  ASSERT_EQ(plan.started.size(), 2u);
  EXPECT_EQ(plan.started[0].rank_workers, (std::vector<std::string>{"gpu0", "gpu1"}));
  EXPECT_EQ(plan.started[1].rank_workers, (std::vector<std::string>{"cpu1", "cpu2"}));
  plan = PlaceQueuedJobs({{"g", 1, 0, "cuda"}}, {{"cpu1"}, {"cpu2"}});
  ASSERT_EQ(WaitingIds(plan), (std::vector<std::string>{"g"}));
  EXPECT_EQ(plan.waiting[0].reason,
            "needs 1 worker on cuda; the pool has 0 such (of 2): it waits for more to register");
  EXPECT_EQ(DeviceKind("cuda:3"), "cuda");
  EXPECT_EQ(DeviceKind("cpu"), "cpu");
}

TEST(RecoveryLayoutsTest, TheSameLayoutElseTheMostRanksWithTheSameGlobalBatch) {
  // stages x replicas x micro-batches, micro-batch size 1, layers balanced.
  auto layout = [](int stages, int replicas, int micro_batches) {
    model::PipelineLayout l;
    l.stages = stages;
    l.replicas = replicas;
    l.micro_batches = micro_batches;
    return l;
  };
  auto text = [](const std::vector<model::PipelineLayout>& layouts) {
    std::string out;
    for (const model::PipelineLayout& l : layouts) {
      out += std::to_string(l.stages) + "x" + std::to_string(l.replicas) + "x" +
             std::to_string(l.micro_batches) + " ";
    }
    return out;
  };
  EXPECT_EQ(text(RecoveryLayouts(layout(2, 2, 4), 4, false)), "2x2x4 2x1x8 1x2x4 1x1x8 ");
  EXPECT_EQ(text(RecoveryLayouts(layout(2, 2, 4), 3, false)), "2x1x8 1x2x4 1x1x8 ");
  EXPECT_EQ(text(RecoveryLayouts(layout(4, 1, 8), 3, false)), "3x1x8 2x1x8 1x1x8 ");
  EXPECT_EQ(text(RecoveryLayouts(layout(4, 1, 8), 3, true)), "");  // explicit ranges: 4 stages
  EXPECT_EQ(text(RecoveryLayouts(layout(2, 3, 1), 5, false)), "1x3x1 2x1x3 1x1x3 ");  // w | w*m
  EXPECT_EQ(text(RecoveryLayouts(layout(2, 2, 4), 0, false)), "");
  // The rows per micro-batch stay; fixed layers stay with the stage count they were for.
  const model::PipelineLayout fixed{2, 2, 4, 8, {{0, 3}, {3, 7}}};
  const std::vector<model::PipelineLayout> layouts = RecoveryLayouts(fixed, 3, false);
  ASSERT_EQ(text(layouts), "2x1x8 1x2x4 1x1x8 ");
  EXPECT_EQ(layouts[0].stage_layers, fixed.stage_layers);
  EXPECT_TRUE(layouts[1].stage_layers.empty());
  for (const model::PipelineLayout& l : layouts) {
    EXPECT_EQ(l.micro_batch_size, 8);
    EXPECT_EQ(l.global_batch(), fixed.global_batch());
  }
}

// 2 stages x 3 replicas placed on w0..w5: w1 and w4 held stage 0, w0 and w3 stage 1, w2 and w5
// nothing (a spare, a returning worker). Each survivor gets a rank of its own stage, the
// others the ranks left in their order; and no rank leaves its host.
TEST(Placement, SurvivorsKeepTheStagesTheyHoldWithinTheirHosts) {
  const std::vector<std::string> placed = {"w0", "w1", "w2", "w3", "w4", "w5"};
  const std::map<std::string, int> held = {{"w0", 1}, {"w1", 0}, {"w3", 1}, {"w4", 0}};
  const auto held_stage = [&](const std::string& id) {
    auto it = held.find(id);
    return it == held.end() ? -1 : it->second;
  };
  const auto one_host = [](const std::string&) { return std::string("h"); };
  EXPECT_EQ(KeepStagesOnTheirHolders(placed, 2, held_stage, one_host),
            (std::vector<std::string>{"w1", "w0", "w4", "w3", "w2", "w5"}));
  // Two hosts: ranks 0..2 on host a (w0..w2), 3..5 on host b (w3..w5): a survivor moves only
  // within its host, so rank 2 (stage 0) takes a's spare rather than b's stage-0 holder w4.
  const auto two_hosts = [](const std::string& id) { return std::string(id < "w3" ? "a" : "b"); };
  EXPECT_EQ(KeepStagesOnTheirHolders(placed, 2, held_stage, two_hosts),
            (std::vector<std::string>{"w1", "w0", "w2", "w3", "w4", "w5"}));
  // Negative control: nothing held, nothing moves.
  EXPECT_EQ(KeepStagesOnTheirHolders(
                placed, 2, [](const std::string&) { return -1; }, one_host),
            placed);
}

}  // namespace
}  // namespace pipetrain::coordinator::core_test
