// What the survivors of a round hold for the next generation (coordinator/survivor_hold.h),
// pure: a decided round in, the hold's holders, the replica state a generation takes and the
// holders' placing order out. No coordinator, no clock, no sockets.
#include "coordinator/survivor_hold.h"

#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/coordinator/survivor_scenarios.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;

const std::vector<std::string> kWorkers = {"w0", "w1", "w2", "w3", "w4", "w5"};

// scenarios::OneBehindOneGone, decided: it goes on from step 8 and ranks 0 (after its held
// update), 1, 2 and 3 hold their layers.
SurvivorRound DecidedRound() {
  SurvivorRound round = scenarios::OneBehindOneGone();
  round.Decide();
  return round;
}

std::string AnyLive(const std::string& id) { return id + ":1"; }

TEST(SurvivorHold, NamesEachLayersHoldersByWorkerAndTheStageEachRan) {
  const SurvivorRound round = DecidedRound();
  ASSERT_TRUE(round.plan());
  const SurvivorHold hold = SurvivorHold::FromRound(round, kWorkers, 2, "key");
  EXPECT_EQ(hold.step, 8);
  EXPECT_EQ(hold.layer_workers, (std::map<int, std::vector<std::string>>{
                                    {0, {"w0", "w2"}}, {1, {"w0", "w2"}}, {2, {"w1", "w3"}}}));
  EXPECT_EQ(hold.worker_stages,
            (std::map<std::string, int>{{"w0", 0}, {"w1", 1}, {"w2", 0}, {"w3", 1}}));
  EXPECT_TRUE(hold.HeldBy("w3"));
  EXPECT_FALSE(hold.HeldBy("w4"));  // behind: passed over
  EXPECT_FALSE(hold.HeldBy("w5"));  // lost
}

TEST(SurvivorHold, IsNeededUntilTheJobCommitsItsStepAgain) {
  const SurvivorHold hold = SurvivorHold::FromRound(DecidedRound(), kWorkers, 2, "key");
  EXPECT_TRUE(hold.NeededAfter(6));
  EXPECT_TRUE(hold.NeededAfter(7));  // every step before 8 committed: the hold is what goes on
  EXPECT_FALSE(hold.NeededAfter(8));
}

TEST(SurvivorHold, AGenerationAtItsStepTakesTheLiveHoldersAddresses) {
  const SurvivorHold hold = SurvivorHold::FromRound(DecidedRound(), kWorkers, 2, "key");
  const SurvivorHold::ForGeneration taken = hold.StateFor(8, [](const std::string& id) {
    return id == "w2" ? std::string() : AnyLive(id);  // w2 was lost since
  });
  ASSERT_FALSE(taken.missing_layer);
  EXPECT_EQ(taken.state.step(), 8);
  EXPECT_EQ(taken.state.state_key(), "key");
  ASSERT_EQ(taken.state.layers_size(), 3);
  EXPECT_THAT(taken.state.layers(0).addresses(), ElementsAre("w0:1"));
  EXPECT_THAT(taken.state.layers(2).addresses(), ElementsAre("w1:1", "w3:1"));
}

TEST(SurvivorHold, ALayerWithNoHolderLeftOrAnotherStepMeansTheCheckpoint) {
  const SurvivorHold hold = SurvivorHold::FromRound(DecidedRound(), kWorkers, 2, "key");
  const SurvivorHold::ForGeneration gone = hold.StateFor(8, [](const std::string& id) {
    return id == "w1" || id == "w3" ? std::string() : AnyLive(id);
  });
  EXPECT_EQ(gone.missing_layer, 2);
  EXPECT_EQ(gone.state.layers_size(), 0);
  // Negative control: the same hold for another step gives nothing, and says no layer.
  const SurvivorHold::ForGeneration other = hold.StateFor(5, AnyLive);
  EXPECT_FALSE(other.missing_layer);
  EXPECT_EQ(other.state.layers_size(), 0);
}

TEST(SurvivorHold, HoldersArePlacedOneOfEachStageInTurn) {
  const SurvivorHold hold = SurvivorHold::FromRound(DecidedRound(), kWorkers, 2, "key");
  EXPECT_EQ(hold.HolderTurns(),
            (std::map<std::string, int>{{"w0", 0}, {"w1", 0}, {"w2", 1}, {"w3", 1}}));
}

}  // namespace
}  // namespace pipetrain::coordinator
