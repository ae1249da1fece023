// A generation's round of survivors (coordinator/survivor_round.h), pure: reports in,
// instructions out.
#include "coordinator/survivor_round.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/coordinator/survivor_scenarios.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

using scenarios::At;

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

// The survivors that stand at the plan's step (after their held update) hold their layers
// for the next generation; one that cannot reach it (rank 4, behind without the update) is
// passed over, and a rank gone holds nothing.
TEST(SurvivorRound, TheSurvivorsAtThePlansStepHoldTheirLayers) {
  SurvivorRound round = scenarios::OneBehindOneGone();
  round.Decide();
  ASSERT_TRUE(round.plan().has_value());
  ASSERT_EQ(round.plan()->step, 8);
  EXPECT_TRUE(round.holds(0));
  EXPECT_TRUE(round.holds(3));
  EXPECT_FALSE(round.holds(4));
  EXPECT_FALSE(round.holds(5));
  const std::map<int, std::vector<int>> holders = round.Holders();
  EXPECT_EQ(holders, (std::map<int, std::vector<int>>{{0, {0, 2}}, {1, {0, 2}}, {2, {1, 3}}}));
  EXPECT_TRUE(round.InstructionFor(0).hold_state());
  EXPECT_FALSE(round.InstructionFor(4).hold_state());
  // Negative control: a round without a plan holds nothing.
  SurvivorRound none(4, 2);
  none.Report(0, At(3), {0});
  none.Gone(1);
  none.Gone(3);
  none.Report(2, At(3), {0});
  none.Decide();
  ASSERT_FALSE(none.plan().has_value());
  EXPECT_TRUE(none.Holders().empty());
  EXPECT_FALSE(none.holds(0));
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
  EXPECT_THAT(zero.reason(),
              HasSubstr("no replica of stage 1 reported (ranks 1, 3 were lost or ended without "
                        "a report); 2 of 4 ranks reported"));
}

// 2 stages x 3 replicas, 4 ranks reported but none of stage 1: ranks 1 and 3 lost, rank 5
// alive but late. The reason says what became of each rank of stage 1, and that 4 of 6
// reported (it once said "no replica survived" when 4 of 6 had).
TEST(SurvivorRound, AStageWithoutReportsSaysWhatBecameOfEachOfItsRanks) {
  SurvivorRound round(6, 2);
  round.Report(0, At(3));
  round.Report(2, At(3));
  round.Report(4, At(3));
  round.Gone(1);
  round.Gone(3);
  round.Decide();  // the deadline passed without rank 5's report
  ASSERT_FALSE(round.plan().has_value());
  EXPECT_EQ(round.why_not(),
            "no replica of stage 1 reported (ranks 1, 3 were lost or ended without a report; "
            "rank 5 did not report in time); 3 of 6 ranks reported");
  // Negative control: with rank 5's report the round has a plan.
  SurvivorRound late(6, 2);
  for (int r : {0, 2, 4, 5}) late.Report(r, At(3));
  late.Gone(1);
  late.Gone(3);
  late.Decide();
  EXPECT_TRUE(late.plan().has_value()) << late.why_not();
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
