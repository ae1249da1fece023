// The last line of defence of a command-line program (`pipetrain`, `pipetrain-run`): an
// exception that no code caught, in main or in any thread, ends the program with a line
// naming it and exit code 1 (the job failed, or any error not listed: exit_codes.h), never
// with std::terminate's abort (134) and a core dump. Every error a program expects is a
// status with its own message and exit code; this catches the ones it did not.
//
// Header-only, no dependencies. Install once, first thing in main.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"

namespace pipetrain {

namespace uncaught_detail {
inline const char*& Program() {
  static const char* program = "pipetrain";
  return program;
}
}  // namespace uncaught_detail

// From now on an uncaught exception prints "PROGRAM: internal error: an uncaught exception
// (WHAT, its first line) ended it; please report this with the command that led to it" and exits 1.
inline void ReportUncaughtExceptions(const char* program) {
  uncaught_detail::Program() = program;
  std::set_terminate([] {
    std::string what = "std::terminate called without an exception";
    if (std::exception_ptr e = std::current_exception()) {
      what = "not a std::exception";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ex.what();
        what = Printable(what.substr(0, what.find('\n')));  // LibTorch's add a backtrace
      } catch (...) {
      }
    }
    std::fprintf(stderr,
                 "%s: internal error: an uncaught exception (%s) ended it; please report this "
                 "with the command that led to it\n",
                 uncaught_detail::Program(), what.c_str());
    std::fflush(stderr);
    std::_Exit(exit_code::kJobFailed);
  });
}

}  // namespace pipetrain
