// coordinator_capacity's command line (see coordinator_capacity.cc for what it measures) and
// how it stops on an error.
#pragma once

#include <string>
#include <vector>

namespace pipetrain::bench::capacity {

// Prints "coordinator_capacity: MESSAGE" on stderr and exits with status 1: every part of
// the benchmark stops this way when it cannot go on.
[[noreturn]] void Die(const std::string& message);

struct Options {
  std::string coordinator;        // --coordinator HOST:PORT: a running coordinator
  std::string start_coordinator;  // --start-coordinator PATH: one of our own
  int workers = 64;               // simulated workers, a multiple of `stages`
  int stages = 2;
  std::vector<int> threads = {1, 8};  // client thread counts, one set of rows each
  double seconds = 3;                 // per row (--scale: the cadence phase)
  // --scale: the cluster at its real cadence instead (coordinator_capacity_scale.h): every
  // worker heartbeating each interval and reporting a step each `step_s`, from
  // `cadence_threads` client threads.
  bool scale = false;
  // Registrations per second at most (0: as fast as they go): workers that start over a
  // few seconds, as those of a large allocation do.
  double register_per_s = 0;
  double step_s = 1;
  int cadence_threads = 16;
  // The job is submitted before the workers register (it waits queued while they do, as a
  // job submitted to a starting allocation does), instead of after.
  bool submit_first = false;
};

// The options of `argv`; prints the usage and exits 0 for --help, and Dies on an unknown
// argument, a missing value, neither or both of --coordinator and --start-coordinator, or
// counts out of range.
Options ParseArgs(int argc, char** argv);

}  // namespace pipetrain::bench::capacity
