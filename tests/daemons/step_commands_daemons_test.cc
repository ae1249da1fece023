// Step commands sent with the CLI while a 2BW job runs under the daemons: flush, weight-version
// switch, checkpoint and stop each take effect before the step they name on every stage (as
// every rank's step records say), the pipeline never stalls for more than about one step, and
// the weights are those of the delayed-update rule restarted at each switch (computed here
// independently by the un-pipelined reference trainer).
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "jobspec/spec_yaml.h"
#include "rpc/status.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/control/step_commands.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/job/reference/reference_trainer.h"
#include "tests/daemons/local_cluster.h"

namespace pipetrain::test {
namespace {

using ::testing::HasSubstr;

class StepCommandsTest : public DaemonTest {};

// Small; 60 steps is a bound (a stop command ends it earlier).
constexpr char kJob[] = R"(model: {name: gpt, d_model: 32, n_heads: 4, n_layers: 3}
data: {seq_len: 16}
schedule: 2bw
stages: 3
microbatches: 4
microbatch_size: 4
steps: 60
dtype: float64
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
)";

TEST_F(StepCommandsTest, TakeEffectAtTheNamedStepOnEveryStageWithoutStalling) {
  LocalCluster cluster(dir_, 3);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(3));
  const fs::path weights = dir_ / "weights";
  const fs::path checkpoints = dir_ / "checkpoints";
  const std::string spec_text = std::string(kJob) + "weights_dir: " + weights.string() +
                                "\ncheckpoint: {dir: " + checkpoints.string() + "}\n";
  Result submitted = cluster.Cli("submit " + Write("job.yaml", spec_text).string());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  auto stub = cluster.JobStub();
  auto send = [&](v1::StepCommand command, int64_t step) -> absl::StatusOr<int64_t> {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SendCommandRequest request;
    request.set_job_id("job-0001");
    request.set_command(command);
    request.set_step(step);
    v1::SendCommandResponse response;
    grpc::Status s = stub->SendCommand(&ctx, request, &response);
    if (!s.ok()) return rpc::ToAbslStatus(s);
    return response.step();
  };
  // Through the API (a step is shorter than a CLI process's start): once it runs, a flush
  // at the earliest boundary, then the others a few steps apart.
  absl::StatusOr<int64_t> flush = absl::UnavailableError("not running yet");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!flush.ok() && std::chrono::steady_clock::now() < deadline) {
    flush = send(v1::STEP_COMMAND_FLUSH, 0);
    if (!flush.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(flush.ok()) << flush.status();
  const int64_t n_flush = *flush;
  ASSERT_GE(n_flush, 2);
  const int64_t n_switch = n_flush + 4, n_checkpoint = n_flush + 8, n_stop = n_flush + 12;
  for (auto [command, n] : {std::pair{v1::STEP_COMMAND_SWITCH_VERSION, n_switch},
                            std::pair{v1::STEP_COMMAND_CHECKPOINT, n_checkpoint},
                            std::pair{v1::STEP_COMMAND_STOP, n_stop}}) {
    absl::StatusOr<int64_t> at = send(command, n);
    ASSERT_TRUE(at.ok()) << v1::StepCommand_Name(command) << ": " << at.status();
    EXPECT_EQ(*at, n);
  }

  // Too late and out of range are refused, and change nothing.
  absl::StatusOr<int64_t> late = send(v1::STEP_COMMAND_FLUSH, 1);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("too late for step 1"));
  absl::StatusOr<int64_t> beyond = send(v1::STEP_COMMAND_FLUSH, 60);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(beyond.status().message(), HasSubstr("1 <= N < 60"));

  nlohmann::json done = cluster.WaitForJob("job-0001", [](const nlohmann::json& job) {
    return StateOf(job) != "JOB_STATE_RUNNING" && StateOf(job) != "JOB_STATE_QUEUED";
  });
  ASSERT_EQ(StateOf(done), "JOB_STATE_SUCCEEDED") << done.dump();
  EXPECT_EQ(Int64Of(done, "step", -1), n_stop - 1);
  EXPECT_THAT(done.value("message", ""),
              HasSubstr("stopped before step " + std::to_string(n_stop)));

  // The coordinator saw every rank report each command at its boundary.
  Result logs = cluster.Cli("logs job-0001");
  for (auto [verb, n] : {std::pair{"flush", n_flush}, std::pair{"switch", n_switch},
                         std::pair{"checkpoint", n_checkpoint}, std::pair{"stop", n_stop}}) {
    EXPECT_THAT(logs.out, HasSubstr(std::string(verb) + " took effect before step " +
                                    std::to_string(n) + " on all 3 ranks"))
        << logs.out;
  }

  // Every stage's own step records: the commands after step N-1, and the time between step
  // ends: the drain at a boundary costs at most about one more step.
  std::vector<at::Tensor> final_params, checkpoint_params;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    absl::StatusOr<job::StageOutcome> outcome = job::ReadStageOutcome(weights.string(), rank);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    const auto& steps = outcome->stats.steps;
    ASSERT_EQ(static_cast<int64_t>(steps.size()), n_stop);
    std::vector<double> intervals;
    for (size_t t = 0; t < steps.size(); ++t) {
      const int64_t boundary = static_cast<int64_t>(t) + 1;
      const uint32_t expected = boundary == n_flush        ? control::kFlush
                                : boundary == n_switch     ? control::kSwitchVersion
                                : boundary == n_checkpoint ? control::kCheckpoint
                                : boundary == n_stop       ? control::kStop
                                                           : 0u;
      EXPECT_EQ(steps[t].commands_after, expected) << "step " << t;
      if (t > 0) intervals.push_back(steps[t].end_s - steps[t - 1].end_s);
    }
    std::vector<double> sorted = intervals;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    for (int64_t n : {n_flush, n_switch, n_checkpoint}) {
      // The step right after a drained boundary may take one more step at most (the drain
      // itself costs (p-1)/m of a step), plus 100 ms for scheduling noise when other tests
      // share the 2 cores (a step takes tens of milliseconds; a stall on the control plane,
      // a wait for an RPC or a command, would take far longer).
      EXPECT_LE(intervals[n - 1], 2 * median + 0.1) << "step " << n << ", median " << median;
    }
    final_params.insert(final_params.end(), outcome->parameters.begin(), outcome->parameters.end());
  }
  // `pipetrain checkpoint` wrote the job's checkpoint keyed by layer, committed by one rank.
  absl::StatusOr<checkpoint::FoundCheckpoint> found =
      checkpoint::FindCheckpoint(checkpoints.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, n_checkpoint);
  EXPECT_EQ(fs::path(found->dir).filename(), checkpoint::StepDirName(n_checkpoint));
  for (int layer = 0; layer < found->manifest.num_layers; ++layer) {
    absl::StatusOr<std::string> bytes = checkpoint::ReadLayer(*found, layer);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<checkpoint::LayerState> state = checkpoint::ParseLayerState(*bytes);
    ASSERT_TRUE(state.ok()) << state.status();
    checkpoint_params.insert(checkpoint_params.end(), state->parameters.begin(),
                             state->parameters.end());
  }
  EXPECT_THAT(logs.out, HasSubstr("checkpoint before step " + std::to_string(n_checkpoint) +
                                  " committed: " + found->dir))
      << logs.out;

  // The weights: the delayed update, restarted at the switch (a checkpoint leaves it).
  absl::StatusOr<v1::JobSpec> spec = jobspec::JobSpecFromYaml(kJob);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<job::JobSpec> config = job::Validated(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  config->set_steps(static_cast<int>(n_stop));
  auto reference = job::TrainReference(*config, {n_switch});
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_LE(job::MaxRelativeDifference(final_params, *reference), 1e-10);
  auto without_switches = job::TrainReference(*config);
  ASSERT_TRUE(without_switches.ok());
  EXPECT_GT(job::MaxRelativeDifference(final_params, *without_switches), 1e-8);
  config->set_steps(static_cast<int>(n_checkpoint));
  auto at_checkpoint = job::TrainReference(*config, {n_switch});
  ASSERT_TRUE(at_checkpoint.ok());
  EXPECT_LE(job::MaxRelativeDifference(checkpoint_params, *at_checkpoint), 1e-10);
}

// The CLI verbs: a stop ends a long job early and successfully; commands for an unknown or
// queued job are refused.
TEST_F(StepCommandsTest, CliStopEndsALongJobCleanly) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  std::string spec = kJob;
  spec.replace(spec.find("stages: 3"), 9, "stages: 2");
  spec.replace(spec.find("steps: 60"), 9, "steps: 100000");
  Result submitted = cluster.Cli("submit " + Write("job.yaml", spec).string());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  nlohmann::json running = cluster.WaitForJob(
      "job-0001", [](const nlohmann::json& job) { return StateOf(job) != "JOB_STATE_QUEUED"; });
  ASSERT_EQ(StateOf(running), "JOB_STATE_RUNNING") << running.dump();
  Result stop = cluster.Cli("stop job-0001");
  ASSERT_EQ(stop.exit_code, 0) << stop.err;
  EXPECT_THAT(stop.out, HasSubstr("stop scheduled before step "));
  const int64_t n = std::stoll(stop.out.substr(stop.out.find("before step ") + 12));
  nlohmann::json done = cluster.WaitForJob(
      "job-0001", [](const nlohmann::json& job) { return StateOf(job) != "JOB_STATE_RUNNING"; });
  EXPECT_EQ(StateOf(done), "JOB_STATE_SUCCEEDED") << done.dump();
  EXPECT_EQ(Int64Of(done, "step", -1), n - 1);
  EXPECT_TRUE(cluster.WaitForIdleWorkers(2));
}

TEST_F(StepCommandsTest, RefusedForJobsThatDoNotRun) {
  LocalCluster cluster(dir_, 0);
  ASSERT_FALSE(cluster.address().empty());
  Result unknown = cluster.Cli("flush job-0042");
  EXPECT_EQ(unknown.exit_code, 3) << unknown.err;
  Result submitted = cluster.Cli("submit " + Write("job.yaml", kJob).string());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  Result queued = cluster.Cli("switch job-0001");  // no worker: it stays queued
  EXPECT_NE(queued.exit_code, 0);
  EXPECT_THAT(queued.err, HasSubstr("not running"));
  Result no_dir = cluster.Cli("checkpoint job-0001");
  EXPECT_NE(no_dir.exit_code, 0);
}

}  // namespace
}  // namespace pipetrain::test
