// A generation's round of survivors (coordinator/survivor_round.h), pure: reports in,
// instructions out.
#include "coordinator/survivor_round.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

recovery::CommitState At(int64_t next_step, int64_t held_step = -1,
                         std::optional<double> held_loss = std::nullopt) {
  recovery::CommitState s;
  s.next_step = next_step;
  s.held_step = held_step;
  s.held_loss = held_loss;
  return s;
}

// 2 stages x 3 replicas, rank 4 (stage 0 of replica 2) lost. Every place has survivors at
// step 8 or holding its update: step 8; the lowest replica of each place writes, the
// holders apply first.
TEST(SurvivorRound, DecidesOnceEveryRankIsAccountedFor) {
  SurvivorRound round(/*ranks=*/6, /*stages=*/2);
  round.Report(0, At(7, 7));
  round.Report(1, At(7, 7, 2.5));
  round.Report(2, At(8));
  round.Report(3, At(8));
  round.Gone(4);
  EXPECT_FALSE(round.AllAccounted());
  EXPECT_EQ(round.InstructionFor(0).action(), v1::SurvivorInstruction::WAIT);
  round.Report(5, At(7, 7));
  ASSERT_TRUE(round.AllAccounted());
  round.Decide();
  ASSERT_TRUE(round.plan().has_value());
  EXPECT_EQ(round.plan()->step, 8);
  EXPECT_EQ(round.held_loss(), 2.5);
  const v1::SurvivorInstruction zero = round.InstructionFor(0), two = round.InstructionFor(2),
                                five = round.InstructionFor(5);
  EXPECT_EQ(zero.action(), v1::SurvivorInstruction::GO_ON);
  EXPECT_EQ(zero.step(), 8);
  EXPECT_TRUE(zero.apply_held_update());
  EXPECT_TRUE(zero.write_state());
  EXPECT_FALSE(two.apply_held_update());
  EXPECT_FALSE(two.write_state());
  EXPECT_TRUE(five.apply_held_update());
  EXPECT_FALSE(five.write_state());
  // The lost rank, were it to report: abandon.
  EXPECT_EQ(round.InstructionFor(4).action(), v1::SurvivorInstruction::ABANDON);
  // A report after the decision changes nothing.
  round.Report(4, At(8));
  EXPECT_FALSE(round.reported(4));
}

// No replica of stage 1 survived: abandon, saying so (the negative control of the plan).
TEST(SurvivorRound, APlaceWithoutSurvivorsAbandons) {
  SurvivorRound round(4, 2);
  round.Report(0, At(3));
  round.Report(2, At(3));
  round.Gone(1);
  round.Gone(3);
  round.Decide();
  EXPECT_FALSE(round.plan().has_value());
  const v1::SurvivorInstruction zero = round.InstructionFor(0);
  EXPECT_EQ(zero.action(), v1::SurvivorInstruction::ABANDON);
  EXPECT_THAT(zero.reason(), HasSubstr("no replica of rank 1 survived"));
}

TEST(SurvivorRound, AbandonedRoundsTellWhy) {
  SurvivorRound round(4, 2);
  round.Report(0, At(3));
  round.Abandon("the generation ended: the coordinator restarted");
  round.Decide();  // no change once decided
  EXPECT_FALSE(round.plan().has_value());
  EXPECT_THAT(round.InstructionFor(0).reason(), HasSubstr("the coordinator restarted"));
}

// Out-of-range ranks and second reports change nothing.
TEST(SurvivorRound, BadRanksAndSecondReportsAreIgnored) {
  SurvivorRound round(2, 2);
  round.Report(-1, At(1));
  round.Report(7, At(1));
  round.Gone(9);
  round.Report(0, At(4));
  round.Report(0, At(9));
  round.Report(1, At(4));
  round.Decide();
  ASSERT_TRUE(round.plan().has_value());
  EXPECT_EQ(round.plan()->step, 4);
}

}  // namespace
}  // namespace pipetrain::coordinator
