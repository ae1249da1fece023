// coordinator_capacity's command line. See coordinator_capacity_options.h.
#include "bench/coordinator_capacity_options.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace pipetrain::bench::capacity {

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "coordinator_capacity: %s\n", message.c_str());
  std::exit(1);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) Die(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--coordinator") {
      o.coordinator = value(i);
    } else if (a == "--start-coordinator") {
      o.start_coordinator = value(i);
    } else if (a == "--workers") {
      o.workers = std::atoi(value(i).c_str());
    } else if (a == "--stages") {
      o.stages = std::atoi(value(i).c_str());
    } else if (a == "--seconds") {
      o.seconds = std::atof(value(i).c_str());
    } else if (a == "--scale") {
      o.scale = true;
    } else if (a == "--submit-first") {
      o.submit_first = true;
    } else if (a == "--register-per-s") {
      o.register_per_s = std::atof(value(i).c_str());
    } else if (a == "--step-s") {
      o.step_s = std::atof(value(i).c_str());
    } else if (a == "--cadence-threads") {
      o.cadence_threads = std::atoi(value(i).c_str());
    } else if (a == "--threads") {
      o.threads.clear();
      std::stringstream list(value(i));
      for (std::string t; std::getline(list, t, ',');) o.threads.push_back(std::atoi(t.c_str()));
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "coordinator_capacity (--coordinator HOST:PORT | --start-coordinator PATH)\n"
          "    [--workers 64] [--stages 2] [--threads 1,8] [--seconds 3]\n"
          "    [--scale [--step-s 1] [--cadence-threads 16]] [--register-per-s R]\n"
          "    [--submit-first]\n"
          "Registers N simulated workers, gets a job assigned to them, and measures\n"
          "Heartbeat and ReportStep throughput and latency from T client threads.\n"
          "--scale: instead, the cluster at its real cadence for --seconds (each worker\n"
          "heartbeating once per interval, each rank reporting a step every --step-s), the\n"
          "coordinator's CPU per second of cluster time (its pid known with\n"
          "--start-coordinator), and what grows with N: placement, the job's status, the\n"
          "workers listing, the end of the job.\n"
          "--register-per-s: registrations per second at most (default: unpaced).\n"
          "--submit-first: the job is submitted before the workers register, and waits\n"
          "queued while they do.\n");
      std::exit(0);
    } else {
      Die("unknown argument " + a + " (see --help)");
    }
  }
  if (o.coordinator.empty() == o.start_coordinator.empty()) {
    Die("give exactly one of --coordinator HOST:PORT and --start-coordinator PATH");
  }
  if (o.workers < 1 || o.stages < 1 || o.workers % o.stages != 0) {
    Die("--workers must be a positive multiple of --stages");
  }
  if (o.seconds <= 0 || o.threads.empty()) Die("--seconds and --threads must be positive");
  if (o.step_s <= 0 || o.cadence_threads < 1 || o.register_per_s < 0) {
    Die("--step-s and --cadence-threads must be positive");
  }
  for (int t : o.threads) {
    if (t < 1) Die("--threads: every count must be >= 1");
  }
  return o;
}

}  // namespace pipetrain::bench::capacity
