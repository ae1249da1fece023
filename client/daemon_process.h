// The daemons as child processes: how `pipetrain run`'s local cluster, the daemon tests and
// the benchmarks start pipetrain-coordinator and pipetrain-worker, learn the address one
// serves on, and stop them. No gRPC and no LibTorch here.
//
// A daemon started with `--port-file PATH` writes "host:port\n" there once it serves, then
// "metrics host:port\n" for its /metrics endpoint (atomically: a reader sees all of it or
// nothing); WaitForPortFile reads the first line, MetricsAddress the second. No log line is
// parsed.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::client {

// Starts argv[0] with `argv` (runtime/base/subprocess.h), stdin from /dev/null, stdout and
// stderr to `log` (truncated). The child gets `death_signal` if this process dies first, so
// that no daemon outlives whoever started it. Returns its pid, or -1 if it cannot start.
// Stop it with subprocess::Stop; subprocess::Exited says whether it has exited.
pid_t SpawnDaemon(const std::vector<std::string>& argv, const std::string& log, int death_signal);

// Waits until `port_file` holds an address; Unavailable, with the end of `log`, if `pid`
// exits first or `timeout` passes (then it does not stop the process).
absl::StatusOr<std::string> WaitForPortFile(const std::string& port_file, pid_t pid,
                                            absl::Duration timeout, const std::string& log);
// The /metrics address a port file names ("" if none, or not written yet).
std::string MetricsAddress(const std::string& port_file);

// The last `lines` non-empty lines of `log`, each indented by four spaces.
std::string LogTail(const std::string& log, int lines = 8);

}  // namespace pipetrain::client
