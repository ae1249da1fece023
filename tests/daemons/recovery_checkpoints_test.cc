// Checkpoints that go wrong under the daemons: one that cannot be written is reported in the
// job's events and the job goes on; a corrupt newest checkpoint is passed over for the one
// before it, in the job's events and status; a layer that cannot be read is the job's cause,
// not the peer's closed connection.
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pipetrain/v1/job_service.grpc.pb.h"
#include "tests/daemons/local_cluster.h"
#include "tests/daemons/recovery_fixture.h"

namespace pipetrain::test::recovery_test {
namespace {

// A checkpoint that cannot be written (its directory is a file here; a full disk behaves the
// same) is reported in the job's events; the job goes on and succeeds, its restart point
// unchanged.
TEST_F(RecoveryTest, AFailedCheckpointIsReportedAndTheJobGoesOn) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  std::ofstream(dir_ / "not-a-directory") << "x";
  std::ofstream(dir_ / "job.yaml")
      << "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\nstages: 2\nsteps: 12\n"
      << "checkpoint: {dir: " << (dir_ / "not-a-directory" / "ckpt").string() << ", every: 5}\n";
  Result done = cluster.Cli("submit " + (dir_ / "job.yaml").string() + " --follow");
  EXPECT_EQ(done.exit_code, 0) << done.err;
  Result logs = cluster.Cli("logs job-0001");
  EXPECT_THAT(logs.out, HasSubstr("checkpoint before step 5 failed on stage"));
  EXPECT_THAT(logs.out, HasSubstr("the job goes on; its restart point stays at step 0"));
  EXPECT_THAT(logs.out, HasSubstr("checkpoint before step 10 failed on stage"));
  EXPECT_EQ(GetJob(*cluster.JobStub(), "job-0001").checkpoint_step(), 0);
}

// A small job of 2 stages: what the checkpoint tests below run and resume (their steps,
// checkpoint and resume_from appended).
constexpr char kSmallJob[] =
    "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\n"
    "stages: 2\noptimizer: {name: sgd, lr: 0.05}\n";

// Runs kSmallJob for `steps` steps with a checkpoint every `every` in `ckpt` (its file
// written to `file`); whether it succeeded.
bool RunSmallJobWithCheckpoints(LocalCluster& cluster, const fs::path& file, const fs::path& ckpt,
                                int steps, int every) {
  std::ofstream(file) << kSmallJob << "steps: " << steps << "\ncheckpoint: {dir: " << ckpt.string()
                      << ", every: " << every << "}\n";
  Result done = cluster.Cli("submit " + file.string() + " --follow");
  EXPECT_EQ(done.exit_code, 0) << done.err;
  return done.exit_code == 0;
}

// A job resuming from a directory whose newest checkpoint is corrupt resumes from the one
// before it, and says so where its user looks: an event and its status name the checkpoint
// passed over and why (this was once only in a worker's stderr: the job silently ran steps
// again). The same job also shows a checkpoint directory is free again once its job ended.
TEST_F(RecoveryTest, ACorruptNewestCheckpointPassedOverIsInTheEventsAndTheStatus) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  const fs::path ckpt = dir_ / "ckpt";
  ASSERT_TRUE(RunSmallJobWithCheckpoints(cluster, dir_ / "first.yaml", ckpt, 8, 4));
  const std::string job = kSmallJob;
  ASSERT_TRUE(fs::exists(ckpt / "step-00000008"));
  ASSERT_TRUE(fs::exists(ckpt / "step-00000004"));
  const fs::path layer = ckpt / "step-00000008" / "layer-00001.pt";
  std::fstream f(layer, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(40);
  f.put('\x7f');
  f.close();
  std::ofstream(dir_ / "second.yaml")
      << job << "steps: 12\nresume_from: latest\ncheckpoint: {dir: " << ckpt.string() << "}\n";
  Result second = cluster.Cli("submit " + (dir_ / "second.yaml").string() + " --follow");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const v1::Job resumed = GetJob(*cluster.JobStub(), "job-0002");
  EXPECT_EQ(resumed.resumed_from(), (ckpt / "step-00000004").string());
  ASSERT_EQ(resumed.checkpoints_passed_over_size(), 1);
  EXPECT_THAT(resumed.checkpoints_passed_over(0), HasSubstr("step-00000008"));
  EXPECT_THAT(resumed.checkpoints_passed_over(0), HasSubstr("SHA-256"));
  Result logs = cluster.Cli("logs job-0002");
  EXPECT_THAT(logs.out, HasSubstr("resuming: passed over"));
  EXPECT_THAT(logs.out, HasSubstr("resumed from " + (ckpt / "step-00000004").string()));
  Result status = cluster.Cli("status job-0002");
  EXPECT_THAT(status.out, HasSubstr("passed over"));
}

// A checkpoint layer whose bytes match its manifest but cannot be unpickled fails its rank
// after the ranks have joined, and the peer then fails on its closed connection. The job's
// message is the layer's error, the first real cause (it was once the peer's "Connection
// closed by peer", the real cause only in a worker's stderr).
TEST_F(RecoveryTest, AnUnreadableLayerIsTheJobsCauseNotThePeersClosedConnection) {
  LocalCluster cluster(dir_, 2);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  const fs::path ckpt = dir_ / "ckpt";
  ASSERT_TRUE(RunSmallJobWithCheckpoints(cluster, dir_ / "first.yaml", ckpt, 5, 4));
  const std::string job = kSmallJob;
  const fs::path step = ckpt / "step-00000004";
  const std::string garbage(64, 'z');
  std::ofstream(step / "layer-00003.pt", std::ios::binary | std::ios::trunc) << garbage;
  Result sha = cluster.Shell("sha256sum " + (step / "layer-00003.pt").string());
  ASSERT_EQ(sha.exit_code, 0);
  nlohmann::json manifest = nlohmann::json::parse(ReadFile(step / "manifest.json"));
  for (auto& f : manifest["files"]) {
    if (f["layer"] == 3) {
      f["bytes"] = garbage.size();
      f["sha256"] = sha.out.substr(0, 64);
    }
  }
  std::ofstream(step / "manifest.json", std::ios::trunc) << manifest.dump();
  std::ofstream(dir_ / "second.yaml") << job << "steps: 8\nresume_from: " << step.string() << "\n";
  Result second = cluster.Cli("submit " + (dir_ / "second.yaml").string() + " --follow");
  EXPECT_EQ(second.exit_code, 1) << second.out << second.err;
  const v1::Job failed = GetJob(*cluster.JobStub(), "job-0002");
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.message(), HasSubstr("layer-00003.pt")) << failed.message();
  EXPECT_THAT(failed.message(), ::testing::Not(HasSubstr("closed by peer"))) << failed.message();
  EXPECT_TRUE(cluster.WaitForIdleWorkers(2, std::chrono::seconds(10)));
}

}  // namespace
}  // namespace pipetrain::test::recovery_test
