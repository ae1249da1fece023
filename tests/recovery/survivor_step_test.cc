// PlanSurvivorStep by hand: the survivors go on from the newest step every place can stand at
// (an update every place holds is applied, though no one got to), those holding its update
// apply it, each place's lowest replica that reaches it supplies it; a place with no
// survivor, and survivors whose updates were not committed (one stage ahead of another), are
// refused with every reason.
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

TEST(PlanSurvivorStep, AnUpdateEveryPlaceHoldsIsAppliedThoughNoOneDid) {
  // The commit of step 4 began everywhere and ended nowhere: place 0 of replica 0 and place
  // 1 of replica 1 hold it (its other survivors do not), so the step is done.
  std::vector<Survivor> s = All(2, 2, 4, 0, 1);  // (0,0) (1,0) (1,1)
  s[0].state = {4, 4};
  s[2].state = {4, 4};
  auto plan = PlanSurvivorStep(s, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->step, 5);
  EXPECT_THAT(plan->apply_held, ElementsAre(0, 2));
  // Place 1's source is the replica that reaches step 5, not the lowest one.
  EXPECT_THAT(plan->sources, ElementsAre(0, 2));
}

TEST(PlanSurvivorStep, AnUpdateSomePlaceLacksIsDropped) {
  // Place 1's only survivor never entered the commit of step 4: every place goes on from 4.
  std::vector<Survivor> s = All(2, 2, 4, 1, 1);  // (0,0) (1,0) (0,1)
  s[0].state = {4, 4};
  s[2].state = {4, 4};
  auto plan = PlanSurvivorStep(s, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->step, 4);
  EXPECT_TRUE(plan->apply_held.empty());
  EXPECT_THAT(plan->sources, ElementsAre(0, 1));
}

TEST(PlanSurvivorStep, APlaceWithNoSurvivorIsRefused) {
  auto plan = PlanSurvivorStep({{0, 0, {3, -1}}, {2, 1, {3, -1}}}, 3);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("no replica of stage 1 survived"));
}

TEST(PlanSurvivorStep, UncommittedUpdatesAreRefusedNamingWhatEachPlaceReaches) {
  // Without the commit: place 1 applied step 3 while place 0 neither did nor holds it.
  std::vector<Survivor> s = {{0, 0, {3, -1}}, {1, 0, {4, -1}}, {0, 1, {3, -1}}};
  auto plan = PlanSurvivorStep(s, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("no step is one every stage's survivors can stand at (stage 0 at step 3; "
                        "stage 1 at step 4): the updates were not committed"));
}

TEST(PlanSurvivorStep, ARankOutsideThePipelineIsRefused) {
  auto plan = PlanSurvivorStep({{0, 0, {1, -1}}, {5, 0, {1, -1}}}, 1);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("survivor 1 names rank 5 of 1"));
}

}  // namespace
}  // namespace pipetrain::recovery
