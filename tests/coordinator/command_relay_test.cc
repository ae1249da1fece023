// The step-command relay alone: where a command for a job goes (rank 0's worker) or why it
// cannot go; the call it makes; the counts for /metrics. No coordinator. (The tally of the
// ranks' reports is the job controller's: job_controller_test.cc.)
#include "coordinator/command_relay.h"

#include <memory>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// A worker that schedules every command at step 7, or refuses with `refusal`.
class RecordingWorker : public WorkerClient {
 public:
  absl::Status AssignStage(const v1::StageAssignment&) override { return absl::OkStatus(); }
  absl::Status StopStage(const v1::StopStageRequest&) override { return absl::OkStatus(); }
  absl::StatusOr<v1::SendCommandResponse> ScheduleCommand(
      const v1::SendCommandRequest& request) override {
    requests.push_back(request);
    if (!refusal.ok()) return refusal;
    v1::SendCommandResponse response;
    response.set_step(7);
    return response;
  }
  absl::Status Ping() override { return absl::OkStatus(); }
  std::vector<v1::SendCommandRequest> requests;
  absl::Status refusal;
};

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-0001");
  job.set_state(v1::JOB_STATE_RUNNING);
  return job;
}

TEST(CommandRelay, CommandsGoToRank0sWorkerOrSayWhyNot) {
  WorkerPool pool;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto rank0 = std::make_shared<RecordingWorker>();
  for (const char* id : {"worker-1", "worker-2"}) {
    v1::WorkerInfo info;
    info.set_id(id);
    pool.Add(info, id == std::string("worker-1") ? rank0 : std::make_shared<RecordingWorker>(),
             std::string("session-") + id, t0);
  }
  const std::vector<std::string> ranks = {"worker-1", "worker-2"};
  absl::StatusOr<std::shared_ptr<WorkerClient>> target =
      CommandRelay::Rank0(RunningJob(), Phase::kRunning, ranks, pool);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->get(), rank0.get());
  absl::StatusOr<int64_t> boundary =
      CommandRelay::Send(**target, "job-0001", v1::STEP_COMMAND_CHECKPOINT);
  ASSERT_TRUE(boundary.ok());
  EXPECT_EQ(*boundary, 7);
  ASSERT_EQ(rank0->requests.size(), 1u);
  EXPECT_EQ(rank0->requests[0].job_id(), "job-0001");
  EXPECT_EQ(rank0->requests[0].command(), v1::STEP_COMMAND_CHECKPOINT);
  rank0->refusal = absl::FailedPreconditionError("not rank 0 now");
  EXPECT_EQ(CommandRelay::Send(*rank0, "job-0001", v1::STEP_COMMAND_FLUSH).status().code(),
            absl::StatusCode::kFailedPrecondition);

  v1::Job queued = RunningJob();
  queued.set_state(v1::JOB_STATE_QUEUED);
  EXPECT_THAT(CommandRelay::Rank0(queued, Phase::kQueued, ranks, pool).status().message(),
              HasSubstr("is not running (JOB_STATE_QUEUED)"));
  EXPECT_THAT(CommandRelay::Rank0(RunningJob(), Phase::kRecovering, ranks, pool).status().message(),
              HasSubstr("is recovering from a fault"));
  EXPECT_EQ(CommandRelay::Rank0(RunningJob(), Phase::kRunning, {"worker-9"}, pool).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(CommandRelay::Rank0(RunningJob(), Phase::kRunning, {}, pool).status().code(),
            absl::StatusCode::kUnavailable);
  pool.MarkLost(*pool.Find("worker-1"), t0, "stopped sending heartbeats");
  EXPECT_THAT(CommandRelay::Rank0(RunningJob(), Phase::kRunning, ranks, pool).status().message(),
              HasSubstr("the worker of rank 0 of job-0001 is lost"));
}

TEST(CommandRelay, CountsByCommandAndOutcome) {
  CommandRelay relay;
  relay.Count(v1::STEP_COMMAND_FLUSH, absl::OkStatus());
  relay.Count(v1::STEP_COMMAND_FLUSH, absl::OkStatus());
  relay.Count(v1::STEP_COMMAND_STOP, absl::FailedPreconditionError("not running"));
  relay.Count(v1::STEP_COMMAND_UNSPECIFIED, absl::InvalidArgumentError("no command"));
  EXPECT_THAT(relay.counts(), UnorderedElementsAre(Pair(Pair("flush", "scheduled"), 2),
                                                   Pair(Pair("stop", "FAILED_PRECONDITION"), 1),
                                                   Pair(Pair("unknown", "INVALID_ARGUMENT"), 1)));
}

}  // namespace
}  // namespace pipetrain::coordinator
