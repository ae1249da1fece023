// Every job file in examples/ is accepted by the coordinator as `pipetrain submit` sends it:
// the CLI's YAML reading (client/spec_yaml) and the coordinator's complete validation
// (proto/job_spec: every field, and the partition against the model's layers). The
// coordinator has no workers, so each job is only queued; nothing trains. That
// `pipetrain run` takes every example too is cli_test's EveryExampleJobRuns.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

class ExamplesSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pipetrain_examples_submit_test_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path log = dir_ / "coordinator.log";
    std::vector<std::string> args = {PIPETRAIN_COORDINATOR, "--listen", "127.0.0.1:0", "--db",
                                     (dir_ / "jobs.db").string()};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    const std::regex listening("listening on ([0-9.]+:[0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (address_.empty() && std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string text = ReadFile(log);
      if (std::regex_search(text, m, listening)) {
        address_ = m[1];
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    ASSERT_FALSE(address_.empty()) << ReadFile(log);
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (!HasFailure()) fs::remove_all(dir_);
  }

  Result Cli(const std::string& args) {
    const fs::path out = dir_ / "cli.out", err = dir_ / "cli.err";
    const std::string command = std::string(PIPETRAIN_CLI) + " " + args + " --coordinator " +
                                address_ + " >" + out.string() + " 2>" + err.string() +
                                " </dev/null";
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out), ReadFile(err)};
  }

  fs::path dir_;
  pid_t pid_ = -1;
  std::string address_;
};

TEST_F(ExamplesSubmitTest, EveryExampleIsAcceptedByTheCoordinator) {
  std::vector<fs::path> examples;
  for (const auto& entry : fs::directory_iterator(fs::path(PIPETRAIN_SOURCE_DIR) / "examples")) {
    if (entry.path().extension() == ".yaml") examples.push_back(entry.path());
  }
  std::sort(examples.begin(), examples.end());
  ASSERT_GE(examples.size(), 6u);
  for (const fs::path& example : examples) {
    SCOPED_TRACE(example.string());
    Result r = Cli("submit " + example.string() + " -o json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto job = nlohmann::json::parse(r.out);
    EXPECT_EQ(job.at("state"), "JOB_STATE_QUEUED");  // no workers: validated, then queued
    EXPECT_GE(job.at("stages").get<int>(), 1);
    EXPECT_GE(job.value("replicas", 0), 1);
    EXPECT_GE(job.value("steps", 0), 1);
  }
  // Each waits for workers; `list` has them all.
  Result list = Cli("list -o json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(std::count(list.out.begin(), list.out.end(), '\n'),
            static_cast<long>(examples.size()));
  EXPECT_THAT(list.out, HasSubstr("JOB_STATE_QUEUED"));
}

// The check above is a real one: a spec the coordinator refuses fails the same command.
TEST_F(ExamplesSubmitTest, AnInvalidJobFileIsRefused) {
  const fs::path bad = dir_ / "bad.yaml";
  std::ofstream(bad) << "model: {name: gpt, n_layers: 4}\nstages: [[0, 3], [3, 9]]\n";
  Result r = Cli("submit " + bad.string() + " -o json");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("stages"));
}

}  // namespace
