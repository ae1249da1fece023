// A stage's step reports through an outage of the coordinator longer than the reporter's
// queue: every report reaches the coordinator once it answers again, in order, none skipped;
// the stage waits for room meanwhile instead of losing its oldest reports, and the reporter
// tries again at its pace, not in a loop.
#include "worker/step_reporter.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/coordinator_client.h"

namespace pipetrain::worker {
namespace {

// Takes step reports only while up; while down every ReportSteps is UNAVAILABLE (a
// coordinator out of reach). Nothing else is called.
class ReportsOnlyCoordinator : public CoordinatorClient {
 public:
  void SetUp(bool up) {
    std::lock_guard<std::mutex> lock(mu_);
    up_ = up;
  }
  int refused_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_calls_;
  }
  std::vector<int64_t> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }

  absl::StatusOr<v1::ReportResponse> ReportSteps(const v1::StepReports& reports) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!up_) {
      ++refused_calls_;
      return absl::UnavailableError("the coordinator is out of reach");
    }
    for (const v1::StepReport& r : reports.reports()) steps_.push_back(r.step());
    return v1::ReportResponse();
  }
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest&) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest&, absl::Duration,
                         v1::HeartbeatResponse*) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status ReportStageEnd(const v1::StageEnd&, absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<v1::DrainWorkerResponse> Drain(const v1::DrainWorkerRequest&) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::Status Deregister(const v1::DeregisterWorkerRequest&) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const v1::StoppedRank&,
                                                        absl::Duration) override {
    return absl::UnimplementedError("not in this test");
  }
  std::shared_ptr<rendezvous::KeyValueStore> JobStore(const std::string&, int) override {
    return nullptr;
  }

 private:
  std::mutex mu_;
  bool up_ = true;
  int refused_calls_ = 0;
  std::vector<int64_t> steps_;
};

// 6000 steps (the queue holds 4000) produced while the coordinator is out of reach: the
// stage is held at the queue's bound, the refused batch is tried again every 100 ms (not in
// a tight loop), and once the coordinator answers, steps 0..5999 arrive in order with none
// missing. (Negative controls, both seen failing: trimming the oldest reports when a refused
// batch is put back, as the reporter once did, lost 2,000 of the 6,000; without the wait
// after a refusal, the reporter tried again about 5,000 times a second.)
TEST(StepReporter, AnOutageLongerThanTheQueueHoldsTheStageAndLosesNoReport) {
  auto coordinator = std::make_shared<ReportsOnlyCoordinator>();
  coordinator->SetUp(false);
  constexpr int kSteps = 6000;
  std::atomic<int> added{0};
  std::atomic<bool> any_dropped{false};
  {
    StepReporter reporter(coordinator, [] {});
    std::thread stage([&] {
      for (int s = 0; s < kSteps; ++s) {
        v1::StepReport report;
        report.set_step(s);
        if (!reporter.Add(std::move(report), absl::Seconds(60))) any_dropped = true;
        ++added;
      }
    });
    // Down for several refused batches after the queue has filled.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((added.load() < 4000 || coordinator->refused_calls() < 3) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GE(coordinator->refused_calls(), 3);
    // Then a second more: a refused batch is tried again once every 100 ms, not in a loop.
    const int refused_before = coordinator->refused_calls();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_GE(coordinator->refused_calls() - refused_before, 3);
    EXPECT_LE(coordinator->refused_calls() - refused_before, 12) << "tried again in a loop";
    EXPECT_LT(added.load(), kSteps) << "the stage was not held while the coordinator was away";
    coordinator->SetUp(true);
    stage.join();
  }  // the reporter sends what is left, then closes
  EXPECT_FALSE(any_dropped);
  const std::vector<int64_t> steps = coordinator->steps();
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << "reports lost or repeated";
  for (int s = 0; s < kSteps; ++s) ASSERT_EQ(steps[s], s) << "at position " << s;
}

}  // namespace
}  // namespace pipetrain::worker
