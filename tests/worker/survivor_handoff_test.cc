// A survivor's part after a fault (worker/survivor_handoff.h) against a scripted coordinator:
// it reports its state once per call, waits while told WAIT (within the wait named), carries
// out GO_ON (its held update applied when told), does nothing on ABANDON, and gives up after
// kSurvivorAttempts calls without an answer or once the wait named has passed: never a wait
// without a deadline. The write of a survivor's state is tested end to end
// (tests/daemons/survivors_test.cc).
#include "worker/survivor_handoff.h"

#include <deque>
#include <mutex>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace pipetrain::worker {
namespace {

// Answers ReportStopped from a script (the last answer repeats); records what it was told.
class ScriptedCoordinator : public CoordinatorClient {
 public:
  explicit ScriptedCoordinator(std::deque<absl::StatusOr<v1::SurvivorInstruction>> script)
      : script_(std::move(script)) {}
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest&) override {
    return v1::RegisterWorkerResponse();
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest&, absl::Duration,
                         v1::HeartbeatResponse*) override {
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ReportResponse> ReportSteps(const v1::StepReports&) override {
    return v1::ReportResponse();
  }
  absl::Status ReportStageEnd(const v1::StageEnd&, absl::Duration) override {
    return absl::OkStatus();
  }
  absl::StatusOr<v1::DrainWorkerResponse> Drain(const v1::DrainWorkerRequest&) override {
    return v1::DrainWorkerResponse();
  }
  absl::Status Deregister(const v1::DeregisterWorkerRequest&) override { return absl::OkStatus(); }
  std::shared_ptr<rendezvous::KeyValueStore> JobStore(const std::string&, int) override {
    return nullptr;
  }
  absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const v1::StoppedRank& stopped,
                                                        absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    reports.push_back(stopped);
    absl::StatusOr<v1::SurvivorInstruction> answer = script_.front();
    if (script_.size() > 1) script_.pop_front();
    return answer;
  }
  std::vector<v1::StoppedRank> reports;

 private:
  std::mutex mu_;
  std::deque<absl::StatusOr<v1::SurvivorInstruction>> script_;
};

v1::SurvivorInstruction Answer(v1::SurvivorInstruction::Action action, int64_t wait_ms = 0) {
  v1::SurvivorInstruction a;
  a.set_action(action);
  a.set_wait_ms(wait_ms);
  if (action == v1::SurvivorInstruction::GO_ON) {
    a.set_step(8);
    a.set_apply_held_update(true);
  }
  if (action == v1::SurvivorInstruction::ABANDON) a.set_reason("no replica of rank 1 survived");
  return a;
}

struct Fixture {
  v1::StageAssignment assignment;
  job::JobSpec config;
  job::StoppedRank stopped;
  int applied = 0;
  Fixture() {
    assignment.set_job_id("job-0001");
    assignment.set_rank(3);
    assignment.set_generation(2);
    stopped.error = absl::UnavailableError("lost stage 0");
    stopped.state.next_step = 7;
    stopped.state.held_step = 7;
    stopped.state.held_loss = 1.25;
    stopped.apply_held_update = [this] {
      ++applied;
      return absl::OkStatus();
    };
  }
  SurvivorOutcome Run(CoordinatorClient& c, bool closing = false) {
    return HandOffSurvivor(c, assignment, "worker-4", config, stopped,
                           [closing] { return closing; });
  }
};

TEST(SurvivorHandoff, ReportsItsStateWaitsAndAppliesItsHeldUpdateWhenToldToGoOn) {
  Fixture f;
  ScriptedCoordinator c({Answer(v1::SurvivorInstruction::WAIT, 5000),
                         Answer(v1::SurvivorInstruction::WAIT, 5000),
                         Answer(v1::SurvivorInstruction::GO_ON)});
  const SurvivorOutcome out = f.Run(c);
  ASSERT_EQ(c.reports.size(), 3u);
  const v1::StoppedRank& r = c.reports[0];
  EXPECT_EQ(r.rank(), 3);
  EXPECT_EQ(r.generation(), 2);
  EXPECT_EQ(r.next_step(), 7);
  EXPECT_EQ(r.held_step(), 7);
  EXPECT_TRUE(r.has_held_loss());
  EXPECT_EQ(r.held_loss(), 1.25);
  EXPECT_EQ(r.error(), "lost stage 0");
  EXPECT_EQ(f.applied, 1);
  EXPECT_TRUE(out.checkpoint.empty());  // not told to write
  EXPECT_TRUE(out.failed.empty());
}

TEST(SurvivorHandoff, AbandonDoesNothing) {
  Fixture f;
  ScriptedCoordinator c({Answer(v1::SurvivorInstruction::ABANDON)});
  const SurvivorOutcome out = f.Run(c);
  EXPECT_EQ(c.reports.size(), 1u);
  EXPECT_EQ(f.applied, 0);
  EXPECT_EQ(out.step, -1);
}

TEST(SurvivorHandoff, GivesUpAfterCallsWithoutAnAnswer) {
  Fixture f;
  ScriptedCoordinator c({absl::UnavailableError("connection refused")});
  const SurvivorOutcome out = f.Run(c);
  EXPECT_EQ(c.reports.size(), static_cast<size_t>(kSurvivorAttempts));
  EXPECT_EQ(f.applied, 0);
  EXPECT_TRUE(out.failed.empty());
}

// WAIT forever, within a wait of 300 ms: it gives up once that has passed (the negative
// control of the first test: no GO_ON, no update applied).
TEST(SurvivorHandoff, GivesUpOnceTheWaitNamedHasPassed) {
  Fixture f;
  ScriptedCoordinator c({Answer(v1::SurvivorInstruction::WAIT, 300)});
  const absl::Time start = absl::Now();
  f.Run(c);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(f.applied, 0);
}

TEST(SurvivorHandoff, AClosingWorkerDoesNotWait) {
  Fixture f;
  ScriptedCoordinator c({Answer(v1::SurvivorInstruction::WAIT, 60000)});
  f.Run(c, /*closing=*/true);
  EXPECT_EQ(c.reports.size(), 1u);
  EXPECT_EQ(f.applied, 0);
}

}  // namespace
}  // namespace pipetrain::worker
