// The last line of defence of the command-line programs (runtime/base/uncaught_exceptions.h):
// an exception nobody caught, in any thread, ends the process with one line
// naming it (its first line, escaped) and exit code 1. The negative control: without it the
// same exception aborts the process (SIGABRT, exit 134 through a shell).
#include "runtime/base/uncaught_exceptions.h"

#include <csignal>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace pipetrain {
namespace {

[[noreturn]] void ThrowFromAThread() {
  std::thread([] { throw std::runtime_error("boom\x1b[31m\nand a backtrace"); }).join();
  std::abort();  // not reached: the thread's exception ends the process first
}

TEST(UncaughtExceptionsDeathTest, EndTheProgramWithALineAndExitCodeOne) {
  EXPECT_EXIT(
      {
        ReportUncaughtExceptions("pipetrain-test");
        ThrowFromAThread();
      },
      ::testing::ExitedWithCode(exit_code::kJobFailed),
      "pipetrain-test: internal error: an uncaught exception \\(boom\\\\x1b\\[31m\\) ended it");
  EXPECT_EXIT(
      {
        ReportUncaughtExceptions("pipetrain-test");
        std::thread([] { throw 42; }).join();  // gtest catches what main's thread throws
      },
      ::testing::ExitedWithCode(exit_code::kJobFailed), "\\(not a std::exception\\)");
}

TEST(UncaughtExceptionsDeathTest, WithoutThemTheSameExceptionAborts) {
  EXPECT_EXIT(ThrowFromAThread(), ::testing::KilledBySignal(SIGABRT), "");
}

}  // namespace
}  // namespace pipetrain
