// Child processes (runtime/base/subprocess.h) against /bin/sh: exit codes, output to a file
// and captured, stop after a grace period, the death signal, and a program that is missing.
#include "runtime/base/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace pipetrain::subprocess {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Subprocess, ExitCodesAndCapturedOutput) {
  absl::StatusOr<pid_t> pid = Start({"/bin/sh", "-c", "exit 7"});
  ASSERT_TRUE(pid.ok()) << pid.status();
  const int status = Wait(*pid);
  EXPECT_EQ(ExitCode(status), 7);
  EXPECT_EQ(DescribeExit(status), "exited with status 7");

  absl::StatusOr<Captured> captured =
      RunCapturingStdout({"/bin/sh", "-c", "printf 'a\\nb'; read x; exit 3"});
  ASSERT_TRUE(captured.ok()) << captured.status();
  EXPECT_EQ(captured->stdout_text, "a\nb");
  EXPECT_EQ(captured->exit_code, 3);
}

TEST(Subprocess, OutputGoesToTheFileAndStdinIsEmpty) {
  const std::string log = ::testing::TempDir() + "/subprocess_test.log";
  Options options;
  options.output_file = log;
  // `read` fails at once on /dev/null (an inherited terminal or pipe could block it).
  absl::StatusOr<pid_t> pid =
      Start({"/bin/sh", "-c", "echo out; echo err >&2; read x || echo no-input"}, options);
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(ExitCode(Wait(*pid)), 0);
  EXPECT_EQ(ReadFile(log), "out\nerr\nno-input\n");
}

// A child that ignores SIGTERM is killed once the grace period is over; one that exits on it
// is reaped with its code.
TEST(Subprocess, StopKillsAfterTheGrace) {
  absl::StatusOr<pid_t> stubborn = Start({"/bin/sh", "-c", "trap '' TERM; sleep 30"});
  ASSERT_TRUE(stubborn.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the trap is set
  const absl::Time start = absl::Now();
  EXPECT_EQ(Stop(*stubborn, SIGTERM, absl::Milliseconds(300)), -1);  // killed
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(Exited(*stubborn));

  absl::StatusOr<pid_t> polite =
      Start({"/bin/sh", "-c", "trap 'kill $!; exit 4' TERM; sleep 30 & wait"});
  ASSERT_TRUE(polite.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(Stop(*polite, SIGTERM, absl::Seconds(10)), 4);
}

// The death signal reaches a grandchild whose parent (a child of this test) dies.
TEST(Subprocess, TheDeathSignalOutlivesNoParent) {
  const std::string pid_file = ::testing::TempDir() + "/subprocess_grandchild.pid";
  std::filesystem::remove(pid_file);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    Options options;
    options.death_signal = SIGKILL;
    absl::StatusOr<pid_t> child = Start({"/bin/sh", "-c", "sleep 60"}, options);
    if (!child.ok()) _exit(1);
    std::ofstream(pid_file) << *child;
    _exit(0);  // without waiting: the grandchild gets SIGKILL
  }
  ASSERT_EQ(ExitCode(Wait(parent)), 0);
  pid_t grandchild = -1;
  std::ifstream(pid_file) >> grandchild;
  ASSERT_GT(grandchild, 0);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    // Reparented, so not ours to reap: gone once it is a zombie or no longer there.
    std::ifstream stat("/proc/" + std::to_string(grandchild) + "/stat");
    std::string line;
    gone = !std::getline(stat, line) || line.find(") Z") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "pid " << grandchild << " outlived its parent";
  if (!gone) kill(grandchild, SIGKILL);
}

TEST(Subprocess, AMissingProgramExitsWith127AndExecSaysWhy) {
  absl::StatusOr<pid_t> pid = Start({"/nonexistent/program"});
  ASSERT_TRUE(pid.ok());
  EXPECT_EQ(ExitCode(Wait(*pid)), 127);
  const absl::Status s = Exec({"/nonexistent/program"});
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/program"));
  EXPECT_FALSE(Start({}).ok());
}

}  // namespace
}  // namespace pipetrain::subprocess
