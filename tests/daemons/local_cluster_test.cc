// The control plane for real: a pipetrain-coordinator and pipetrain-worker processes on
// loopback, driven by the pipetrain CLI.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Result {
  int exit_code = -1;
  std::string out, err;
};

// A coordinator and `workers` workers, each a process of its own with its log in `dir`;
// every one is killed when the cluster goes away.
class LocalCluster {
 public:
  LocalCluster(const fs::path& dir, int workers) : dir_(dir) {
    pids_.push_back(Spawn({PIPETRAIN_COORDINATOR, "--listen", "127.0.0.1:0", "--db",
                           (dir / "jobs.db").string(), "--heartbeat-ms", "500"},
                          dir / "coordinator.log"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    const std::regex listening("listening on ([0-9.]+:[0-9]+)");
    while (address_.empty() && std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string log = ReadFile(dir / "coordinator.log");
      if (std::regex_search(log, m, listening)) {
        address_ = m[1];
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    for (int w = 0; w < workers; ++w) {
      pids_.push_back(Spawn({PIPETRAIN_WORKER, "--coordinator", address_},
                            dir / ("worker" + std::to_string(w) + ".log")));
    }
  }
  ~LocalCluster() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  const std::string& address() const { return address_; }

  // Waits until `n` workers are idle (as `pipetrain workers` says).
  bool WaitForIdleWorkers(int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      Result r = Cli("workers -o json");
      int idle = 0;
      std::istringstream lines(r.out);
      for (std::string line; std::getline(lines, line);) {
        if (!line.empty() && nlohmann::json::parse(line).value("state", "") == "idle") ++idle;
      }
      if (idle >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  Result Cli(const std::string& args) {
    return Shell(std::string(PIPETRAIN_CLI) + " " + args + " --coordinator " + address_);
  }
  Result Shell(const std::string& command) {
    const fs::path out = dir_ / "cli.out", err = dir_ / "cli.err";
    const int status = std::system(
        (command + " >" + out.string() + " 2>" + err.string() + " </dev/null").c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out), ReadFile(err)};
  }

 private:
  static pid_t Spawn(std::vector<std::string> args, const fs::path& log) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ), 0) << args[0];
    posix_spawn_file_actions_destroy(&actions);
    return pid;
  }

  fs::path dir_;
  std::string address_;
  std::vector<pid_t> pids_;
};

class LocalClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipetrain_cluster_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  fs::path Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }
  fs::path dir_;
};

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
  const fs::path weights = dir_ / "weights";
  const fs::path spec = Write("job.yaml", std::string(kJob) + "weights_dir: " + weights.string() + "\n");
  Result submitted = cluster.Cli("submit " + spec.string() + " --follow");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.out << submitted.err
                                    << ReadFile(dir_ / "coordinator.log");
  EXPECT_THAT(submitted.out, HasSubstr("job-0001 succeeded"));

  Result status = cluster.Cli("status job-0001 -o json");
  ASSERT_EQ(status.exit_code, 0) << status.err;
  const auto job = nlohmann::json::parse(status.out);
  EXPECT_EQ(job.at("state"), "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(job.at("step"), "5");  // int64 is a string in proto3 JSON
  ASSERT_EQ(job.at("stage_status").size(), 4u);
  for (const auto& stage : job.at("stage_status")) {
    EXPECT_EQ(stage.at("state"), "done");
    EXPECT_EQ(stage.at("step"), "5");
    EXPECT_GT(stage.value("compute_s", 0.0), 0.0) << stage.dump();  // reported with each step
  }

  // The same spec without daemons, stages as threads of one process.
  const fs::path reference = dir_ / "reference.pt";
  Result ran = cluster.Shell(std::string(PIPETRAIN_CLI) + " run " +
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
        "dtype: expected float32 or float64", "2bw needs micro_batches >= stages"}) {
    EXPECT_THAT(r.err, HasSubstr(needle));
  }
  // Structural errors are caught before anything is sent.
  Result unknown = cluster.Cli("submit " + Write("typo.yaml", "stepz: 3\nmodel: {d_modell: 8}\n").string());
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

}  // namespace
