// The worker's stage slot alone, on a fake clock: a rank starts, a retried assignment starts
// nothing, another is refused while one runs; a stop reaches the stage once it has a stopper
// (also when asked for before), never a stage of another job or generation; the next rank
// waits for one on its way out, up to its patience on the clock; a closed slot takes none;
// rank 0's command queue; a drain's wait ends with the rank or at its deadline.
#include "worker/stage_slot.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"

namespace pipetrain::worker {
namespace {

using ::testing::ElementsAre;

// A stage body that runs until released, recording the stops that reach it.
struct FakeStage {
  void Body(StageSlot* slot, bool install_stopper = true) {
    if (install_stopper) {
      slot->SetStopper(
          [this](const absl::Status& why) { stops.push_back(std::string(why.message())); });
    }
    running.Notify();
    finish.WaitForNotification();
    ended_reason = slot->MarkEnded();
    ended.Notify();
    may_release.WaitForNotification();
    slot->Release();
  }
  std::vector<std::string> stops;  // written under the slot's lock
  absl::Notification running, finish, ended, may_release;
  std::string ended_reason;
};

TEST(StageSlot, ARankStartsARetriedAssignmentStartsNothingAnotherIsRefused) {
  auto clock = std::make_shared<FakeClock>();
  StageSlot slot(clock);
  FakeStage stage;
  std::atomic<int> started{0};
  ASSERT_TRUE(slot.Start("job-1", 0, 1, absl::ZeroDuration(),
                         [&] {
                           ++started;
                           stage.Body(&slot);
                         })
                  .ok());
  stage.running.WaitForNotification();
  EXPECT_TRUE(slot.Start("job-1", 0, 1, absl::ZeroDuration(), [&] { ++started; }).ok());
  const absl::Status busy = slot.Start("job-2", 1, 1, absl::ZeroDuration(), [&] { ++started; });
  EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(busy.message(), "busy with rank 0 of job-1");
  // Another generation of the same job is another assignment.
  EXPECT_EQ(slot.Start("job-1", 0, 2, absl::ZeroDuration(), [&] { ++started; }).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slot.occupant().job_id, "job-1");
  stage.finish.Notify();
  stage.may_release.Notify();
  slot.Shutdown("done");
  EXPECT_EQ(started.load(), 1);
}

TEST(StageSlot, AStopReachesItsStageOnlyAndOnceItHasAStopperAlsoWhenAskedBefore) {
  auto clock = std::make_shared<FakeClock>();
  StageSlot slot(clock);
  FakeStage stage;
  absl::Notification stopped_early;
  ASSERT_TRUE(
      slot.Start("job-1", 0, 2, absl::ZeroDuration(),
                 [&] {
                   stopped_early.WaitForNotification();  // told to stop while still being built
                   stage.Body(&slot);
                 })
          .ok());
  slot.Stop("job-2", 0, "not mine");             // another job
  slot.Stop("job-1", 1, "an older generation");  // sent before this rank was assigned
  EXPECT_EQ(slot.occupant().stop_reason, "");
  slot.Stop("job-1", 2, "stopped: restarting");
  slot.Stop("job-1", 0, "stopped: a second reason");  // the first is kept
  stopped_early.Notify();
  stage.running.WaitForNotification();
  slot.StopAny("the coordinator no longer knows this worker");
  EXPECT_THAT(stage.stops, ElementsAre("stopped: restarting", "stopped: restarting"));
  stage.finish.Notify();
  stage.ended.WaitForNotification();
  EXPECT_EQ(stage.ended_reason, "stopped: restarting");
  slot.Stop("job-1", 0, "after its end");  // ending: no stop applies
  EXPECT_EQ(stage.stops.size(), 2u);
  stage.may_release.Notify();
  slot.Shutdown("done");
}

TEST(StageSlot, TheNextRankWaitsForOneOnItsWayOutUpToItsPatienceOnTheClock) {
  auto clock = std::make_shared<FakeClock>();
  StageSlot slot(clock);
  FakeStage first;
  ASSERT_TRUE(slot.Start("job-1", 0, 1, absl::ZeroDuration(), [&] { first.Body(&slot); }).ok());
  first.running.WaitForNotification();
  first.finish.Notify();
  first.ended.WaitForNotification();  // ending: its end being reported

  // Its patience runs out on the clock, however long it waits in real time.
  absl::Status refused;
  std::thread impatient([&] { refused = slot.Start("job-2", 0, 1, absl::Seconds(8), [] {}); });
  absl::SleepFor(absl::Milliseconds(200));
  clock->Advance(absl::Seconds(9));
  impatient.join();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);

  // Released within its patience: it starts.
  FakeStage second;
  absl::Status started;
  std::thread patient(
      [&] { started = slot.Start("job-2", 0, 1, absl::Seconds(8), [&] { second.Body(&slot); }); });
  absl::SleepFor(absl::Milliseconds(200));
  first.may_release.Notify();
  patient.join();
  EXPECT_TRUE(started.ok()) << started;
  second.running.WaitForNotification();
  EXPECT_EQ(slot.occupant().job_id, "job-2");
  second.finish.Notify();
  second.may_release.Notify();
  slot.Shutdown("done");
}

TEST(StageSlot, AClosedSlotTakesNoRankAndShutdownStopsAndJoinsTheOneRunning) {
  auto clock = std::make_shared<FakeClock>();
  StageSlot slot(clock);
  FakeStage stage;
  ASSERT_TRUE(slot.Start("job-1", 0, 1, absl::ZeroDuration(), [&] { stage.Body(&slot); }).ok());
  stage.running.WaitForNotification();
  slot.Close("the worker is draining");
  const absl::Status refused = slot.Start("job-2", 0, 1, absl::ZeroDuration(), [] {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused.message(), "the worker is draining");
  std::thread shutdown([&] { slot.Shutdown("the worker is shutting down"); });
  // The stop reached the stage (the stage ends when stopped; here the test ends it).
  while (slot.occupant().stop_reason.empty()) absl::SleepFor(absl::Milliseconds(5));
  stage.finish.Notify();
  stage.may_release.Notify();
  shutdown.join();  // returns only once the stage's thread has ended
  EXPECT_THAT(stage.stops, ElementsAre("the worker is shutting down"));
  EXPECT_EQ(slot.occupant().job_id, "");
}

TEST(StageSlot, Rank0sCommandQueueOnlyWhileItRunsAndIsNotStopped) {
  auto clock = std::make_shared<FakeClock>();
  StageSlot slot(clock);
  FakeStage stage;
  auto queue = std::make_shared<control::StepCommandQueue>(100);
  ASSERT_TRUE(slot.Start("job-1", 0, 1, absl::ZeroDuration(),
                         [&] {
                           slot.SetCommandQueue(queue);
                           stage.Body(&slot);
                         })
                  .ok());
  stage.running.WaitForNotification();
  EXPECT_EQ(slot.CommandQueueOf("job-1"), queue);
  EXPECT_EQ(slot.CommandQueueOf("job-2"), nullptr);
  slot.Stop("job-1", 0, "stopped");
  EXPECT_EQ(slot.CommandQueueOf("job-1"), nullptr);
  stage.finish.Notify();
  stage.may_release.Notify();
  slot.Shutdown("done");
}

TEST(StageSlot, ADrainsWaitEndsWithTheRankOrAtItsDeadlineOnTheClock) {
  auto clock = std::make_shared<FakeClock>();
  StageSlot slot(clock);
  FakeStage stage;
  ASSERT_TRUE(slot.Start("job-1", 0, 1, absl::ZeroDuration(), [&] { stage.Body(&slot); }).ok());
  stage.running.WaitForNotification();
  bool ended = true;
  std::thread waiter(
      [&] { ended = slot.WaitUntilNotRunning("job-1", clock->Now() + absl::Minutes(1)); });
  absl::SleepFor(absl::Milliseconds(100));
  clock->Advance(absl::Minutes(2));
  waiter.join();
  EXPECT_FALSE(ended);  // the clock passed the deadline; the rank still runs

  std::thread waiter2(
      [&] { ended = slot.WaitUntilNotRunning("job-1", clock->Now() + absl::Minutes(1)); });
  stage.finish.Notify();
  stage.may_release.Notify();
  waiter2.join();
  EXPECT_TRUE(ended);
  EXPECT_TRUE(slot.WaitUntilNotRunning("job-1", clock->Now()));
  slot.Shutdown("done");
}

}  // namespace
}  // namespace pipetrain::worker
