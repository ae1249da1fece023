// The CLI test fixture: runs the built `pipetrain` binary (PIPETRAIN_CLI) with arguments,
// in a fresh directory per test, and reads what it printed. Shared by the CLI test files
// (one binary, cli_test).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pipetrain::cli_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Result {
  int exit_code = -1;
  std::string out, err;
  double seconds = 0;
};

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What `stages: auto` runs of a plan (`plan -o json`) on one host: the schedule marked in its
// `schedules` where that is another than the planner's own (the same keys), else the plan.
inline nlohmann::json AutoRuns(const nlohmann::json& plan) {
  if (plan.contains("rank_hosts")) return plan;
  for (const nlohmann::json& s : plan["schedules"]) {
    if (s["best"].get<bool>() && s["schedule"] != plan["schedule"]) return s;
  }
  return plan;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A parameterized test's name is "Test/case": one folder, not two.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ =
        fs::temp_directory_path() / ("pipetrain_cli_test_" + std::to_string(getpid()) + "_" + name);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `run` without --launch is given --launch threads: these tests are about the runner
  // itself, without daemons (the local cluster has tests of its own).
  // " --stages R", and " --virtual-stages V" where V > 0 (0: the schedule's default).
  static std::string LayoutFlags(int ranks, int virtual_stages) {
    std::string flags = " --stages " + std::to_string(ranks);
    if (virtual_stages > 0) flags += " --virtual-stages " + std::to_string(virtual_stages);
    return flags;
  }

  Result Run(std::string args) {
    if (args.rfind("run", 0) == 0 && args.find("--launch") == std::string::npos) {
      args.insert(3, " --launch threads");
    }
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string command = std::string(PIPETRAIN_CLI) + " " + args + " >" + out.string() +
                                " 2>" + err.string() + " </dev/null";
    const auto start = std::chrono::steady_clock::now();
    const int status = std::system(command.c_str());
    Result r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  fs::path Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path;
  }

  // Bad input: exit 2 (or `exit_code`: 3 for a file that is not there), one line
  // "pipetrain: ..." naming the problem, no report written.
  void ExpectRejected(const std::string& args, const std::string& needle, int exit_code = 2) {
    SCOPED_TRACE(args);
    const fs::path summary = dir_ / "summary.json";
    Result r = Run(args + " --summary " + summary.string());
    EXPECT_EQ(r.exit_code, exit_code) << r.err;
    EXPECT_THAT(r.err, StartsWith("pipetrain: "));
    EXPECT_THAT(r.err, HasSubstr(needle));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(summary));
    EXPECT_TRUE(fs::is_empty(dir_ / "stdout") || r.out.empty());
  }

  fs::path dir_;
};

}  // namespace pipetrain::cli_test
