// coordinator_capacity --scale: a cluster of N simulated workers at its real cadence, and what
// grows with N.
//
//   cadence  for `seconds`, every worker heartbeats once per heartbeat interval (with its job
//            and rank, as a busy worker does, going on from its last heartbeat) and reports
//            its rank's next step once per `step_s` (one ReportSteps call each, as a
//            worker's reporter sends a 1 s step), at a phase of its own, from `threads` client
//            threads (each its own connection, its workers in turn). Measured: the calls made
//            against the calls due (a client that falls behind says so), the p50 / p99 latency
//            of each kind, and the coordinator's CPU seconds (from /proc, when its pid is
//            known) per second of cluster time;
//   probes   with the job of N ranks running: GetJob of it (its status), ListWorkers (the
//            `pipetrain workers` listing), each timed 10 times with the reply's size.
// Placement (submit to every rank assigned) and the end of the job (cancel, then a stage end
// from every rank) are timed by the caller (coordinator_capacity.cc).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/coordinator_capacity_cluster.h"
#include "bench/coordinator_capacity_options.h"

namespace pipetrain::bench::capacity {

struct CadenceResult {
  double seconds = 0;                     // wall time of the phase
  int64_t calls_due = 0, calls_made = 0;  // by the schedule; sent
  int64_t errors = 0;
  std::string first_error;
  std::vector<double> heartbeat_us, report_us;  // latencies of the calls that succeeded, sorted
  double coordinator_cpu_s = -1;                // user + system; -1: its pid is not known
};

// The cadence phase. `coordinator_pid` <= 0: its CPU is not read. Updates `cluster`'s
// per-worker heartbeat times and per-rank steps.
CadenceResult RunCadence(const std::string& target, Cluster& cluster, pid_t coordinator_pid,
                         double seconds, double step_s, int threads);

struct ProbeResult {
  std::string name;
  std::vector<double> ms;  // each call's latency, sorted
  int64_t reply_bytes = 0;
};

// GetJob of the running job and ListWorkers, 10 times each.
std::vector<ProbeResult> RunProbes(const std::string& target, const Cluster& cluster);

// The CPU seconds (user + system) process `pid` has used so far; -1 when unreadable.
double ProcessCpuSeconds(pid_t pid);

}  // namespace pipetrain::bench::capacity
