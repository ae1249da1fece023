// Child processes: the one way pipetrain starts, waits for and stops them (the CLI's local
// cluster and the daemons it starts, pipetrain-run's stage processes, the profiler's link
// peer, the tests and benchmarks). absl only; no gRPC, no LibTorch.
//
// A child is started with fork and execve, with only async-signal-safe calls in between, so
// starting one from a process with many threads is safe. The path argv[0] is not searched.
// Thread-safe as the system calls are; each pid is waited for by one thread.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::subprocess {

struct Options {
  // The child's stdout and stderr go to this file (created or truncated); "": inherited.
  std::string output_file;
  // Sent to the child when this process dies first (PR_SET_PDEATHSIG; 0: none), so that no
  // child outlives whoever started it.
  int death_signal = 0;
  // The child's stdin is /dev/null (else inherited).
  bool stdin_null = true;
};

// Starts argv[0] with `argv`. Unavailable if it cannot be started (a missing or
// unexecutable argv[0] shows as the child's exit code 127).
absl::StatusOr<pid_t> Start(const std::vector<std::string>& argv, const Options& options = {});

// Replaces this process with argv[0] run with `argv` (the same pid: signals and the exit
// code become its own). Returns only if that fails, with why.
absl::Status Exec(const std::vector<std::string>& argv);

// Waits for `pid` to exit and reaps it; its wait status (-1 if it is not a child).
int Wait(pid_t pid);
// Whether `pid` has exited (it is then reaped); true for pid <= 0 and for a pid reaped
// before.
bool Exited(pid_t pid);
// Sends `signal`, waits up to `grace` for `pid` to exit, then SIGKILLs it; reaps it. Its exit
// code; -1 if it ended by a signal or `pid` <= 0.
int Stop(pid_t pid, int signal, absl::Duration grace);

// The exit code in a wait status; -1 if the process ended by a signal.
int ExitCode(int wait_status);
// "exited with status N" or "was killed by signal N".
std::string DescribeExit(int wait_status);

// Runs `argv` to its end with its stdout read into a string (stderr inherited): its exit
// code (-1: ended by a signal) and its output.
struct Captured {
  int exit_code = -1;
  std::string stdout_text;
};
absl::StatusOr<Captured> RunCapturingStdout(const std::vector<std::string>& argv);

}  // namespace pipetrain::subprocess
