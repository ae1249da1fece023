// The control plane for real: a pipetrain-coordinator and pipetrain-worker processes on
// loopback, driven by the pipetrain CLI.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "tests/daemons/local_cluster.h"

namespace {

namespace fs = std::filesystem;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::pipetrain::test::Result;
using ::testing::HasSubstr;

class LocalClusterTest : public ::pipetrain::test::DaemonTest {};

constexpr char kJob[] = R"(model: {name: gpt, d_model: 32, n_heads: 4, n_layers: 3}
schedule: 1f1b
stages: 2
replicas: 2
microbatches: 4
microbatch_size: 4
steps: 6
dtype: float64
optimizer: {name: adamw, lr: 0.003}
)";

TEST_F(LocalClusterTest, JobSubmittedWithTheCliMatchesTheRunWithoutDaemons) {
  LocalCluster cluster(dir_, 4);
  ASSERT_FALSE(cluster.address().empty()) << ReadFile(dir_ / "coordinator.log");
  ASSERT_TRUE(cluster.WaitForIdleWorkers(4));
  // Each registered with its device and capacity (host memory for "cpu").
  for (const nlohmann::json& w : cluster.Workers()) {
    EXPECT_EQ(w.value("device", ""), "cpu");
    EXPECT_GT(pipetrain::test::Int64Of(w, "memory_bytes"), int64_t{1} << 20) << w.dump();
  }
  const fs::path weights = dir_ / "weights";
  const fs::path spec =
      Write("job.yaml", std::string(kJob) + "weights_dir: " + weights.string() + "\n");
  Result submitted = cluster.Cli("submit " + spec.string() + " --follow");
  ASSERT_EQ(submitted.exit_code, 0)
      << submitted.out << submitted.err << ReadFile(dir_ / "coordinator.log");
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));

  Result status = cluster.Cli("status job-0001 -o json");
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const auto job = nlohmann::json::parse(status.out);
  EXPECT_EQ(job.at("state"), "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(job.at("step"), "5");  // int64 is a string in proto3 JSON
  ASSERT_EQ(job.at("stage_status").size(), 4u);
  for (const auto& stage : job.at("stage_status")) {
    EXPECT_EQ(stage.at("state"), "STAGE_STATE_DONE");
    EXPECT_EQ(stage.at("step"), "5");
    EXPECT_GT(stage.value("compute_s", 0.0), 0.0) << stage.dump();  // reported with each step
  }

  // The same spec without daemons, stages as threads of one process.
  const fs::path reference = dir_ / "reference.pt";
  Result ran = cluster.Shell(std::string(LocalCluster::cli_path()) + " run --launch threads " +
                             Write("plain.yaml", kJob).string() + " -q --save-weights " +
                             reference.string());
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  std::vector<at::Tensor> expected;
  torch::load(expected, reference.string());
  // Replica 0's stages (ranks 0 and 1): parameters in layer order, then buffers.
  std::vector<at::Tensor> params, buffers;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<at::Tensor> stage;
    torch::load(stage, (weights / ("stage" + std::to_string(rank) + ".pt")).string());
    const auto meta =
        nlohmann::json::parse(ReadFile(weights / ("stage" + std::to_string(rank) + ".json")));
    const size_t n = meta.at("num_parameters");
    params.insert(params.end(), stage.begin(), stage.begin() + n);
    buffers.insert(buffers.end(), stage.begin() + n, stage.end());
  }
  params.insert(params.end(), buffers.begin(), buffers.end());
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(params[i].sizes(), expected[i].sizes()) << i;
    EXPECT_EQ(params[i].scalar_type(), at::kDouble);
    const double denom = std::max(expected[i].norm().item<double>(), 1e-30);
    EXPECT_LE((params[i] - expected[i]).norm().item<double>() / denom, 1e-10) << "tensor " << i;
  }
  // Replica 1 holds the same weights as replica 0 (gradients were averaged).
  std::vector<at::Tensor> r0, r1;
  torch::load(r0, (weights / "stage0.pt").string());
  torch::load(r1, (weights / "stage2.pt").string());
  ASSERT_EQ(r0.size(), r1.size());
  for (size_t i = 0; i < r0.size(); ++i) EXPECT_TRUE(at::equal(r0[i], r1[i])) << i;

  Result logs = cluster.Cli("logs job-0001");
  EXPECT_THAT(logs.out, HasSubstr("submitted"));
  EXPECT_THAT(logs.out, HasSubstr("succeeded: 6 steps"));
}

// A schedule whose ranks hold several model stages (ZB-V: rank r holds stages r and 3 − r,
// their backward split into I and W) on the daemons: the job succeeds, and each rank's weights
// equal those of the same rank of the job run as threads.
TEST_F(LocalClusterTest, AJobWhoseRanksHoldSeveralStagesRunsOnTheDaemons) {
  LocalCluster cluster(dir_, 4);
  ASSERT_FALSE(cluster.address().empty()) << ReadFile(dir_ / "coordinator.log");
  ASSERT_TRUE(cluster.WaitForIdleWorkers(4));
  std::string job = kJob;
  job.replace(job.find("schedule: 1f1b"), 14, "schedule: zbv");
  const fs::path on_daemons = dir_ / "daemons", as_threads = dir_ / "threads";
  Result submitted = cluster.Cli(
      "submit " + Write("zbv.yaml", job + "weights_dir: " + on_daemons.string() + "\n").string() +
      " --follow");
  ASSERT_EQ(submitted.exit_code, 0)
      << submitted.out << submitted.err << ReadFile(dir_ / "coordinator.log");
  Result ran = cluster.Shell(
      std::string(LocalCluster::cli_path()) + " run --launch threads -q " +
      Write("zbv-threads.yaml", job + "weights_dir: " + as_threads.string() + "\n").string());
  ASSERT_EQ(ran.exit_code, 0) << ran.err;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string file = "stage" + std::to_string(rank) + ".pt";
    std::vector<at::Tensor> got, expected;
    torch::load(got, (on_daemons / file).string());
    torch::load(expected, (as_threads / file).string());
    ASSERT_EQ(got.size(), expected.size()) << file;
    for (size_t i = 0; i < got.size(); ++i) {
      const double denom = std::max(expected[i].norm().item<double>(), 1e-30);
      EXPECT_LE((got[i] - expected[i]).norm().item<double>() / denom, 1e-10) << file << " " << i;
    }
    const auto meta =
        nlohmann::json::parse(ReadFile(on_daemons / ("stage" + std::to_string(rank) + ".json")));
    EXPECT_EQ(meta.at("model_stages").size(), 2u) << meta.dump();
  }
}

TEST_F(LocalClusterTest, InvalidSpecListsEveryViolationAndTouchesNoWorker) {
  LocalCluster cluster(dir_, 1);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1));
  const fs::path spec = Write("bad.yaml", R"(model: {name: gpt, d_model: 30, n_heads: 4}
schedule: 2bw
stages: 4
microbatches: 2
microbatch_size: 0
steps: -1
optimizer: {name: sgd, lr: -1}
dtype: float16
)");
  Result r = cluster.Cli("submit " + spec.string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  for (const char* needle :
       {"model.d_model", "microbatch_size: must be >= 1", "steps: must be >= 1", "optimizer.lr",
        "dtype: expected float32, float64 or bfloat16", "2bw needs micro_batches >= stages"}) {
    EXPECT_THAT(r.err, HasSubstr(needle));
  }
  // Structural errors are caught before anything is sent.
  Result unknown =
      cluster.Cli("submit " + Write("typo.yaml", "stepz: 3\nmodel: {d_modell: 8}\n").string());
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("stepz: unknown key"));
  EXPECT_THAT(unknown.err, HasSubstr("model.d_modell: unknown key"));
  // Nothing was queued, the worker was never asked, the coordinator still serves.
  Result list = cluster.Cli("list -o json");
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_EQ(list.out, "");
  EXPECT_EQ(cluster.Cli("health").exit_code, 0);
  EXPECT_THAT(ReadFile(dir_ / "worker0.log"), ::testing::Not(HasSubstr("running rank")));
  EXPECT_EQ(cluster.Cli("status job-0042").exit_code, 3);
}

// `pipetrain run` (the README's main command) on its own local cluster: it starts a
// coordinator and one worker per rank, follows the job to the end, and leaves nothing
// running or on disk behind.
TEST_F(LocalClusterTest, RunStartsALocalClusterAndCleansUp) {
  LocalCluster tools(dir_, 0);  // only for Shell()
  const std::string cli = LocalCluster::cli_path();
  Result r = tools.Shell(cli +
                         " run --stages 2 --replicas 2 --schedule 1f1b --d-model 32 "
                         "--n-layers 2 --microbatches 4 --steps 6 --dtype float64");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("2 stages x 2 replicas on a local cluster of 4 workers"));
  EXPECT_THAT(r.out, HasSubstr("job-0001 succeeded"));
  const std::string marker = "logs in ";
  const size_t at = r.err.find(marker);
  ASSERT_NE(at, std::string::npos);
  const std::string logs =
      r.err.substr(at + marker.size(), r.err.find(')', at) - at - marker.size());
  EXPECT_FALSE(fs::exists(logs)) << logs;
  const size_t port_at = r.err.find("(coordinator ");
  ASSERT_NE(port_at, std::string::npos);
  const std::string address = r.err.substr(port_at + 13, r.err.find(',', port_at) - port_at - 13);
  // "[p]" keeps the pattern from matching the shell that runs pgrep.
  Result left =
      tools.Shell("pgrep -fa '[p]ipetrain-(coordinator|worker).*(" + address + "|" + logs + ")'");
  EXPECT_EQ(left.exit_code, 1) << "still running (or no pgrep): " << left.out << left.err;

  // Too few workers for the job: refused at once, nothing left running; --trace needs the
  // runner without daemons.
  Result few = tools.Shell(cli + " run --stages 2 --replicas 2 --workers 3 --steps 2");
  EXPECT_EQ(few.exit_code, 2) << few.err;
  EXPECT_THAT(few.err, HasSubstr("--workers 3 cannot run job-0001: it has 4 ranks"));
  Result trace = tools.Shell(cli + " run --steps 2 --trace /dev/null");
  EXPECT_EQ(trace.exit_code, 2);
  EXPECT_THAT(trace.err, HasSubstr("--trace: only with --launch threads or processes"));
}

// Heartbeats carry each stage's current action and what it waits for. A worker frozen
// (SIGSTOP) for a moment: the stages before it wait for it, and `status` shows the chain in
// its stage x replica grid; thawed before its heartbeat is missed, the job completes.
TEST_F(LocalClusterTest, StatusShowsWhoWaitsForWhom) {
  pipetrain::test::ClusterOptions options;
  options.workers = 3;
  options.heartbeat_ms = 2000;  // lost after 4 s: the freeze stays well under that
  LocalCluster cluster(dir_, options);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(3));
  Result submitted = cluster.Cli(
      "submit " + Write("job.yaml", R"(model: {name: gpt, d_model: 32, n_heads: 4, n_layers: 3}
schedule: 1f1b
stages: 3
microbatches: 4
microbatch_size: 4
steps: 100000
)")
                      .string());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  auto stub = cluster.JobStub();
  auto get = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pipetrain::v1::GetJobRequest request;
    request.set_id("job-0001");
    pipetrain::v1::Job job;
    EXPECT_TRUE(stub->GetJob(&ctx, request, &job).ok());
    return job;
  };
  // Running, every rank has heartbeated an action.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  pipetrain::v1::Job job;
  for (;;) {
    job = get();
    bool all = job.stage_status_size() == 3;
    for (const auto& st : job.stage_status()) all = all && !st.action().empty();
    if (all || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(job.state(), pipetrain::v1::JOB_STATE_RUNNING);
  // Freeze the worker of stage 2.
  int frozen = -1;
  for (int i = 0; i < 3; ++i) {
    if (ReadFile(cluster.worker_log(i)).find("running rank 2 ") != std::string::npos) frozen = i;
  }
  ASSERT_GE(frozen, 0);
  // Right after its heartbeat, so that it is lost no sooner than 2 intervals minus 200 ms
  // (3.8 s) from now, well after it is thawed.
  const std::string frozen_id = job.stage_status(2).worker_id();
  for (bool fresh = false; !fresh && std::chrono::steady_clock::now() < deadline;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pipetrain::v1::ListWorkersResponse workers;
    ASSERT_TRUE(stub->ListWorkers(&ctx, pipetrain::v1::ListWorkersRequest(), &workers).ok());
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    for (const auto& w : workers.workers()) {
      if (w.id() == frozen_id) fresh = now_ms - w.last_heartbeat_unix_ms() < 200;
    }
    if (!fresh) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(cluster.worker_pid(frozen), SIGSTOP);
  const auto frozen_at = std::chrono::steady_clock::now();
  bool chain = false;
  while (!chain && std::chrono::steady_clock::now() - frozen_at < std::chrono::milliseconds(2500)) {
    job = get();
    chain = job.stage_status(1).waiting_for() == "stage 2" &&
            job.stage_status(0).waiting_for() == "stage 1";
    if (!chain) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Result status = chain ? cluster.Cli("status job-0001") : Result{};
  kill(cluster.worker_pid(frozen), SIGCONT);
  ASSERT_TRUE(chain) << job.DebugString();
  EXPECT_THAT(job.stage_status(1).action(), ::testing::StartsWith("RECV_"));
  EXPECT_THAT(status.out, HasSubstr("who waits for whom"));
  EXPECT_THAT(status.out, ::testing::ContainsRegex("stage 1 +RECV_[A-Z]+[0-9]+ -> stage 2"));
  // Thawed in time: the job goes on.
  Result stop = cluster.Cli("stop job-0001");
  ASSERT_EQ(stop.exit_code, 0) << stop.err;
  nlohmann::json done = cluster.WaitForJob("job-0001", [](const nlohmann::json& j) {
    return pipetrain::test::StateOf(j) != "JOB_STATE_RUNNING";
  });
  EXPECT_EQ(pipetrain::test::StateOf(done), "JOB_STATE_SUCCEEDED") << done.dump();
}

}  // namespace
