// coordinator_capacity's measurements: phases of Heartbeat, ReportStep or both calls from
// client threads against the simulated workers' job, and the Markdown table of their rates
// and latencies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/coordinator_capacity_cluster.h"
#include "bench/coordinator_capacity_options.h"

namespace pipetrain::bench::capacity {

enum class Kind { kHeartbeat, kReportStep, kMixed };

struct PhaseResult {
  int64_t calls = 0, errors = 0;
  double seconds = 0;
  std::vector<double> latencies_us;
  std::string first_error;
};

// Calls of `kind` from `threads` client threads, each with its own channel, for `seconds`
// after every thread has connected: worker (and rank) i round robin, each rank's next step in
// order. The latencies of the calls that succeeded, sorted; failures counted, the first one
// kept. Updates `cluster`'s per-worker heartbeat times and per-rank steps.
PhaseResult RunPhase(const std::string& target, Cluster& cluster, Kind kind, int threads,
                     double seconds);

// The value at quantile `q` (0..1) of `sorted`; 0 when it is empty.
double Percentile(const std::vector<double>& sorted, double q);

// One row per (client threads, kind of call), as a Markdown table on stdout; progress on
// stderr.
void MeasureAndPrint(const Options& options, const std::string& target, Cluster& cluster);

}  // namespace pipetrain::bench::capacity
