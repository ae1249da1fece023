// The job machine, transition by transition: a run and an event in, the run's phase and the
// commands out. No coordinator, no clock, no sockets.
#include "coordinator/job_machine.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Commands in words, so that a table can say what it expects.
std::string Describe(const JobCommand& command) {
  if (const auto* c = std::get_if<StopRanks>(&command)) {
    return absl::StrCat("stop [", absl::StrJoin(c->ranks, ","), "]: ", c->reason);
  }
  if (const auto* c = std::get_if<MarkStage>(&command)) {
    const char* mark = c->mark == StageMark::kDone     ? "done"
                       : c->mark == StageMark::kFailed ? "failed"
                                                       : "lost";
    return absl::StrCat("mark ", c->rank, " ", mark);
  }
  if (const auto* c = std::get_if<Announce>(&command)) return "say: " + c->text;
  if (const auto* c = std::get_if<BeginRecovery>(&command)) {
    return absl::StrCat("recover", c->survivors ? " (survivors may go on)" : "", ": ", c->cause);
  }
  if (const auto* c = std::get_if<EndJob>(&command)) return "end: " + c->message;
  if (const auto* c = std::get_if<Requeue>(&command)) return "requeue: " + c->why;
  return "?";
}

std::vector<std::string> Describe(const Transition& t) {
  std::vector<std::string> out;
  for (const JobCommand& c : t.commands) out.push_back(Describe(c));
  return out;
}

JobRun Running(int ranks, int restarts = 0) {
  JobRun run;
  run.phase = Phase::kRunning;
  run.generation = 1;
  run.restarts = restarts;
  run.rank_ended.assign(ranks, false);
  return run;
}

StageEnded Ok(int rank) {
  StageEnded e;
  e.rank = rank;
  return e;
}

StageEnded Failed(int rank, const std::string& why, bool after_peer = false) {
  StageEnded e;
  e.rank = rank;
  e.ok = false;
  e.failed_after_peer = after_peer;
  e.failure = absl::StrCat("stage ", rank, " failed: ", why);
  e.at = absl::FromUnixSeconds(100);
  return e;
}

const RestartPolicy kNoRestarts{0};
const RestartPolicy kTwoRestarts{2};

TEST(JobMachine, AQueuedJobRunsItsFirstGenerationWhenPlaced) {
  Transition t = Apply(JobRun{}, GenerationStarted{4}, kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kRunning);
  EXPECT_EQ(t.run.generation, 1);
  EXPECT_THAT(t.run.rank_ended, ElementsAre(false, false, false, false));
  EXPECT_THAT(Describe(t), IsEmpty());
}

TEST(JobMachine, EveryRankEndingWellSucceedsStoppedByAStopCommandSaysSo) {
  Transition t = Apply(Running(2), Ok(1), kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kRunning);
  EXPECT_THAT(Describe(t), ElementsAre("mark 1 done"));
  t = Apply(t.run, Ok(0), kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kSucceeded);
  EXPECT_THAT(Describe(t), ElementsAre("mark 0 done", "end: "));  // no rank left to stop

  Transition stopped = Apply(Running(1), StopScheduled{3}, kNoRestarts);
  stopped = Apply(stopped.run, Ok(0), kNoRestarts);
  EXPECT_THAT(Describe(stopped),
              ElementsAre("mark 0 done", "end: stopped before step 3 by a stop command"));
}

// A rank's failure is held while others run; the peers shown alive make it the job's.
TEST(JobMachine, ARankFailureIsHeldUntilThePeersAreShownAlive) {
  Transition t = Apply(Running(3), Failed(2, "out of memory"), kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kHeldFailure);
  EXPECT_EQ(t.run.held_since, absl::FromUnixSeconds(100));
  EXPECT_THAT(Describe(t), ElementsAre("mark 2 failed", "say: stage 2 failed: out of memory"));
  t = Apply(t.run, PeersAlive{}, kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kFailed);
  EXPECT_THAT(Describe(t), ElementsAre("end: stage 2 failed: out of memory",
                                       "stop [0,1]: stage 2 failed: out of memory"));
  // PeersAlive without a held failure changes nothing.
  EXPECT_THAT(Describe(Apply(Running(2), PeersAlive{}, kNoRestarts)), IsEmpty());
}

// A worker lost while a failure is held is the cause: its peers failed because it died.
TEST(JobMachine, AWorkerLostDuringTheHoldIsTheCauseNotTheSurvivor) {
  Transition t = Apply(Running(2), Failed(0, "lost stage 1"), kNoRestarts);
  t = Apply(t.run, RankLost{1, "worker-2 (h:1) running stage 1 stopped sending heartbeats"},
            kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kFailed);
  EXPECT_THAT(
      Describe(t),
      ElementsAre("mark 1 lost", "end: worker-2 (h:1) running stage 1 stopped sending heartbeats"));
}

// The first failure that was not a consequence of another's replaces one that was; the
// last rank ending decides at once (nothing said in between).
TEST(JobMachine, TheRealCauseReplacesAFailureThatFollowedIt) {
  Transition t = Apply(Running(2), Failed(1, "peer closed", /*after_peer=*/true), kNoRestarts);
  EXPECT_TRUE(t.run.held_after_peer);
  t = Apply(t.run, Failed(0, "layer 1 unreadable"), kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kFailed);
  EXPECT_THAT(Describe(t), ElementsAre("mark 0 failed", "end: stage 0 failed: layer 1 unreadable"));
  // The other way round, the first real cause stays.
  t = Apply(Running(3), Failed(1, "disk full"), kNoRestarts);
  t = Apply(t.run, Failed(0, "peer closed", true), kNoRestarts);
  EXPECT_EQ(t.run.held_failure, "stage 1 failed: disk full");
  EXPECT_EQ(t.run.held_since, absl::FromUnixSeconds(100));
}

// A rank lost or failed: the survivors may go on from their newest common step (the
// coordinator's round decides); a Fault (above) names its own restart point.
TEST(JobMachine, ARankLostOrFailedLetsTheSurvivorsGoOn) {
  Transition t = Apply(Running(2), RankLost{1, "worker-2 lost"}, kTwoRestarts);
  EXPECT_THAT(Describe(t), ElementsAre("mark 1 lost", "stop [0]: generation 1 ended: worker-2 lost",
                                       "recover (survivors may go on): worker-2 lost"));
  t = Apply(Running(2), Failed(0, "bad"), kTwoRestarts);
  t = Apply(t.run, PeersAlive{}, kTwoRestarts);
  EXPECT_THAT(Describe(t), ElementsAre("stop [1]: generation 1 ended: stage 0 failed: bad",
                                       "recover (survivors may go on): stage 0 failed: bad"));
}

TEST(JobMachine, AFaultWithRestartsLeftRecoversAndThenFailsWhenNoneAreLeft) {
  Transition t = Apply(Running(2), Fault{"the coordinator restarted"}, kTwoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kRecovering);
  EXPECT_EQ(t.run.restarts, 1);
  EXPECT_THAT(Describe(t),
              ElementsAre("stop [0,1]: generation 1 ended: the coordinator restarted",
                          "recover: the coordinator restarted"));  // no survivors after a Fault
  // Reports, losses and ends of the ended generation change nothing while it recovers.
  for (const JobEvent& stale :
       std::vector<JobEvent>{Ok(0), RankLost{1, "x"}, PeersAlive{}, Fault{"y"}, Unplaceable{0, "z"},
                             StopScheduled{2}}) {
    Transition same = Apply(t.run, stale, kTwoRestarts);
    EXPECT_EQ(same.run.phase, Phase::kRecovering);
    EXPECT_THAT(Describe(same), IsEmpty());
  }
  t = Apply(t.run, GenerationStarted{1}, kTwoRestarts);  // a smaller layout
  EXPECT_EQ(t.run.generation, 2);
  EXPECT_THAT(t.run.rank_ended, ElementsAre(false));
  t = Apply(t.run, Fault{"drained"}, kTwoRestarts);
  EXPECT_EQ(t.run.restarts, 2);
  t = Apply(t.run, GenerationStarted{1}, kTwoRestarts);
  t = Apply(t.run, Failed(0, "bad data"), kTwoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kFailed);
  EXPECT_THAT(Describe(t), ElementsAre("mark 0 failed",
                                       "end: stage 0 failed: bad data (after 2 restarts; "
                                       "max_restarts is 2)"));
}

TEST(JobMachine, ARecoveryWithoutWorkersInTimeFailsWithoutStoppingAnything) {
  JobRun recovering = Running(2);
  recovering.phase = Phase::kRecovering;
  Transition t = Apply(recovering, RecoveryTimedOut{"no workers to restart on"}, kTwoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kFailed);
  EXPECT_THAT(Describe(t), ElementsAre("end: no workers to restart on"));
}

// A rank that cannot be placed sends the job back to the queue, costing no restart; the
// ranks that were placed are stopped.
TEST(JobMachine, AnUnplaceableRankRequeuesTheJobWithoutARestart) {
  Transition t = Apply(Running(3), Unplaceable{1, "worker-2 unreachable"}, kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kQueued);
  EXPECT_EQ(t.run.restarts, 0);
  EXPECT_THAT(t.run.rank_ended, IsEmpty());
  EXPECT_THAT(Describe(t), ElementsAre("stop [0,2]: requeued: worker-2 unreachable",
                                       "requeue: worker-2 unreachable"));
  t = Apply(t.run, GenerationStarted{3}, kNoRestarts);
  EXPECT_EQ(t.run.generation, 2);
}

TEST(JobMachine, AnAssignmentRefusedEndsItsRankAndTheGeneration) {
  Transition t =
      Apply(Running(2), Fault{"assigning stage 1 failed: no such device", 1}, kNoRestarts);
  EXPECT_EQ(t.run.phase, Phase::kFailed);
  EXPECT_THAT(Describe(t), ElementsAre("end: assigning stage 1 failed: no such device",
                                       "stop [0]: assigning stage 1 failed: no such device"));
}

TEST(JobMachine, CancelEndsAnyJobNotEndedAndStopsOnlyRunningRanks) {
  EXPECT_THAT(Describe(Apply(JobRun{}, CancelRequested{}, kNoRestarts)),
              ElementsAre("end: cancelled by the user"));
  Transition running = Apply(Running(2), CancelRequested{}, kNoRestarts);
  EXPECT_EQ(running.run.phase, Phase::kCancelled);
  EXPECT_THAT(Describe(running),
              ElementsAre("end: cancelled by the user", "stop [0,1]: cancelled by the user"));
  JobRun recovering = Running(2);
  recovering.phase = Phase::kRecovering;
  EXPECT_THAT(Describe(Apply(recovering, CancelRequested{}, kNoRestarts)),
              ElementsAre("end: cancelled by the user"));
  // An ended job is final: nothing moves it.
  for (const JobEvent& late : std::vector<JobEvent>{CancelRequested{}, Ok(0), GenerationStarted{2},
                                                    Fault{"x"}, RecoveryTimedOut{"y"}}) {
    Transition t = Apply(running.run, late, kNoRestarts);
    EXPECT_EQ(t.run.phase, Phase::kCancelled);
    EXPECT_THAT(Describe(t), IsEmpty());
  }
}

TEST(JobMachine, PhasesHaveNamesAndTheRightKind) {
  EXPECT_STREQ(PhaseName(Phase::kHeldFailure), "held failure");
  EXPECT_TRUE(IsFinal(Phase::kCancelled));
  EXPECT_FALSE(IsFinal(Phase::kRecovering));
  EXPECT_TRUE(IsRunning(Phase::kRecovering));
  EXPECT_FALSE(IsRunning(Phase::kQueued));
}

}  // namespace
}  // namespace pipetrain::coordinator
