// The fixture of the control plane's security tests (one binary, auth_test): the token the
// cluster shares, a wrong one and a small job written to the test's directory, the options
// of a cluster that asks for the token, the CLI without the cluster's defaults, and the
// refusal the CLI prints. The helpers run on the calling thread; the fixture owns only files
// in its directory.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/daemons/local_cluster.h"

namespace pipetrain::test::auth_test {

using ::testing::HasSubstr;
using ::testing::Not;

inline constexpr char kToken[] = "pt-7d1f0c9a4e5b8326-secret";
inline constexpr char kRefused[] = "refused the call: missing or wrong token";

inline constexpr char kJob[] = R"(model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}
schedule: 1f1b
stages: 2
microbatches: 2
microbatch_size: 2
steps: 3
)";

// The deadline `s` from now.
inline std::chrono::system_clock::time_point In(std::chrono::seconds s) {
  return std::chrono::system_clock::now() + s;
}

// Waits up to `timeout` for the child `pid` to exit, leaving it to be reaped by its owner.
inline bool WaitForExit(pid_t pid, std::chrono::seconds timeout = std::chrono::seconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class AuthTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    unsetenv("PIPETRAIN_TOKEN");  // neither the daemons nor the CLI may find one by accident
    token_ = Write("token", std::string(kToken) + "\n").string();
    wrong_ = Write("wrong", "pt-0000000000000000-guess\n").string();
    job_ = Write("job.yaml", kJob).string();
  }

  // A coordinator asking for the token; the CLI helpers of the cluster give it.
  ClusterOptions WithToken() const {
    ClusterOptions o;
    o.coordinator_args = {"--token-file", token_};
    o.cli_args = {"--token-file", token_};
    return o;
  }

  // The CLI with exactly `args` (no cluster defaults), against `cluster`.
  static Result Bare(LocalCluster& cluster, const std::string& args) {
    return cluster.Shell(std::string(LocalCluster::cli_path()) + " " + args + " --coordinator " +
                         cluster.address());
  }

  std::string token_, wrong_, job_;
};

}  // namespace pipetrain::test::auth_test
