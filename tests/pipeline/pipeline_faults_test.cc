// Stages that cannot go on: a message of the wrong shape or dtype (injected by wrapping the
// real transport) fails the job naming the stage, the micro-batch, what was expected and what
// came; a lost message fails every stage within the deadline; Stop() ends a stage that never
// waits for a peer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "runtime/job/launch/in_process.h"
#include "runtime/job/plan.h"
#include "runtime/schedule/schedule.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "tests/pipeline/forwarding_transport.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

// Fault injection by wrapping the real transport: corrupts or drops one message.
class FaultyTransport : public ForwardingTransport {
 public:
  enum class Fault { kWrongShape, kWrongDtype, kDrop };
  FaultyTransport(std::unique_ptr<transport::Transport> inner, Fault fault, int64_t micro_batch)
      : ForwardingTransport(std::move(inner)), fault_(fault), micro_batch_(micro_batch) {}
  absl::Status SendMessage(int peer, transport::MessageKind kind, int64_t j,
                           const at::Tensor& t) override {
    if (kind != transport::MessageKind::kActivation || j != micro_batch_) {
      return inner_->Send(peer, kind, j, t);
    }
    switch (fault_) {
      case Fault::kWrongShape:
        return inner_->Send(peer, kind, j, at::cat({t, t.narrow(-1, 0, 1)}, -1));
      case Fault::kWrongDtype: return inner_->Send(peer, kind, j, t.to(at::kFloat));
      case Fault::kDrop: return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  Fault fault_;
  int64_t micro_batch_;
};

absl::StatusOr<JobReport> RunWithFault(FaultyTransport::Fault fault, double timeout_s) {
  JobSpec c = TinyGpt(ScheduleKind::kOneFOneB, 3, 4);
  c.set_timeout_s(timeout_s);
  RunOptions options;
  options.wrap_transport = [fault](std::unique_ptr<transport::Transport> t, int stage) {
    if (stage != 1) return t;
    return std::unique_ptr<transport::Transport>(
        new FaultyTransport(std::move(t), fault, /*micro_batch=*/6));
  };
  return RunInProcess(c, options);
}

TEST(CheckedMessages, WrongShapeNamesStageMicroBatchExpectedAndActual) {
  auto report = RunWithFault(FaultyTransport::Fault::kWrongShape, 60);
  ASSERT_FALSE(report.ok());
  const std::string message(report.status().message());
  EXPECT_EQ(message.substr(0, message.find(" [stopped at:")),
            "stage 2 RECV_ACT6: activation of micro-batch 6 from stage 1 has the wrong shape "
            "or dtype: expected float64[2, 8, 16], got float64[2, 8, 17]");
  // Where every stage was when the job stopped: stage 2 at the bad message, the others at a
  // wait that the abort cut short.
  EXPECT_NE(message.find("stopped at: stage 0 "), std::string::npos) << message;
  EXPECT_NE(message.find("stage 2 RECV_ACT6]"), std::string::npos) << message;
}

TEST(CheckedMessages, WrongDtypeIsRejected) {
  auto report = RunWithFault(FaultyTransport::Fault::kWrongDtype, 60);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("expected float64[2, 8, 16], got float32[2, 8, 16]"),
            std::string::npos)
      << report.status();
}

TEST(Watchdog, LostMessageFailsEveryStageWithinTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  auto report = RunWithFault(FaultyTransport::Fault::kDrop, 1.0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDeadlineExceeded);
  // Stage 2 waits for the lost activation while stages 1 and 0 wait for gradients that
  // cannot come; whichever deadline passes first is the error, and where every stage stopped
  // points at the lost message.
  const std::string message(report.status().message());
  EXPECT_NE(message.find(" timed out waiting for the "), std::string::npos) << message;
  EXPECT_NE(message.find("stage 2 RECV_ACT6"), std::string::npos) << message;
  EXPECT_LT(seconds, 5.0);
}

// A one-stage job never waits for a peer, so aborting its transport alone would not stop it:
// Stop() does, before the next action, with the reason given.
TEST(Stop, EndsAStageThatNeverWaitsForAPeer) {
  JobSpec c = TinyGpt(ScheduleKind::kOneFOneB, 1, 1);
  c.set_steps(1000000);  // far more than run before the stop
  absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  MicroBatchReader reader(*plan, c.microbatches());
  absl::StatusOr<StageParts> parts = BuildStage(c, *plan, reader, 0);
  ASSERT_TRUE(parts.ok()) << parts.status();
  auto hub = transport::MakeInProcessHub();
  std::unique_ptr<transport::Transport> transport =
      transport::MakeInProcessTransport(hub, 0, 1, 0, 1);
  std::atomic<int64_t> steps_done{0};
  executor::StageExecutor executor(parts->config, parts->weight_stores(), transport.get(),
                                   [&](const executor::StepRecord&) { ++steps_done; });
  absl::Status result;
  std::thread stage([&] { result = executor.Run(); });
  while (steps_done < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto stopped = std::chrono::steady_clock::now();
  executor.Stop(absl::CancelledError("the coordinator ended the job"));
  stage.join();
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, std::chrono::seconds(1));
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(result.message(), "the coordinator ended the job");
  EXPECT_TRUE(executor.stopped_at().has_value());
  EXPECT_LT(steps_done.load(), 1000000);
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
