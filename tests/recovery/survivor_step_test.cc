// PlanSurvivorStep by hand: the survivors go on from the newest step any of them applied,
// those holding its update apply it, each place's lowest surviving replica supplies it; a
// place with no survivor, and survivors whose updates were not committed (one stage ahead of
// another), are refused with every reason.
#include "runtime/recovery/survivor_step.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::recovery {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `ranks` places x `replicas`, replica-major, all at W(next) holding nothing, less `lost`.
std::vector<Survivor> All(int ranks, int replicas, int64_t next, int lost_rank = -1,
                          int lost_replica = -1) {
  std::vector<Survivor> out;
  for (int k = 0; k < replicas; ++k) {
    for (int r = 0; r < ranks; ++r) {
      if (r == lost_rank && k == lost_replica) continue;
      out.push_back({r, k, {next, -1}});
    }
  }
  return out;
}

TEST(PlanSurvivorStep, EveryoneAtOneStepGoesOnFromIt) {
  // 2 places x 3 replicas, place 0 of replica 0 lost: replica 1 supplies place 0.
  auto plan = PlanSurvivorStep(All(2, 3, 7, 0, 0), 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->step, 7);
  EXPECT_TRUE(plan->apply_held.empty());
  // Survivors: (1,0) (0,1) (1,1) (0,2) (1,2).
  EXPECT_THAT(plan->sources, ElementsAre(1, 0));
}

TEST(PlanSurvivorStep, ThoseHoldingTheNewestUpdateApplyIt) {
  // A fault while the commit of step 4 ended: some applied it, the rest hold it.
  std::vector<Survivor> s = All(2, 3, 5, 1, 2);
  s[0].state = {4, 4};
  s[3].state = {4, 4};
  auto plan = PlanSurvivorStep(s, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->step, 5);
  EXPECT_THAT(plan->apply_held, ElementsAre(0, 3));
}

TEST(PlanSurvivorStep, AnUpdateNobodyAppliedIsDropped) {
  // The commit of step 4 began and no one finished it: every survivor drops what it holds.
  std::vector<Survivor> s = All(2, 2, 4, 0, 1);
  s[0].state = {4, 4};
  s[2].state = {4, 4};
  auto plan = PlanSurvivorStep(s, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->step, 4);
  EXPECT_TRUE(plan->apply_held.empty());
}

TEST(PlanSurvivorStep, APlaceWithNoSurvivorAndUncommittedUpdatesAreRefusedWithEveryReason) {
  // Place 1 lost in both replicas; place 0 of replica 0 one step behind and holding nothing
  // (without the commit, the other stage updated first).
  std::vector<Survivor> s = {{0, 0, {3, -1}}, {0, 1, {4, -1}}, {2, 0, {4, -1}},
                             {2, 1, {2, 2}}};
  auto plan = PlanSurvivorStep(s, 3);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("no replica of rank 1 survived"));
  EXPECT_THAT(message, HasSubstr("rank 0 of replica 0 has applied the updates before step 3 "
                                 "and holds none while another survivor applied step 3's"));
  EXPECT_THAT(message, HasSubstr("rank 2 of replica 1 has applied the updates before step 2 "
                                 "and holds step 2's"));
}

TEST(PlanSurvivorStep, ARankOutsideThePipelineIsRefused) {
  auto plan = PlanSurvivorStep({{0, 0, {1, -1}}, {5, 0, {1, -1}}}, 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("survivor 1 names rank 5 of 1"));
}

}  // namespace
}  // namespace pipetrain::recovery
