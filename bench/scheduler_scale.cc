// scheduler_scale: how the coordinator's scheduling decisions grow with the cluster. The
// scheduler is pure (coordinator/scheduler.h), so its decisions are timed alone, as the
// coordinator makes them under its lock:
//   PlanQueue     one queued job of 8 stages x N/8 replicas placed on N idle workers;
//   PlanRecovery  that job's next generation after one of its N workers was lost: N - 1
//                 idle, so after the grace it takes the best smaller layout (RecoveryLayouts,
//                 each layout's spec checked, the memory of every worker compared).
// For each N, the median of repeated calls (at least 0.2 s of them) and its ratio to the
// previous N's: about 2 for each doubling is linear.
//
//   build/bench/scheduler_scale [N ...]     (default 256 1024 4096; a job has 4,096 ranks at most)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "coordinator/scheduler.h"

namespace {

using pipetrain::coordinator::PlacementPlan;
using pipetrain::coordinator::QueuedJob;
using pipetrain::coordinator::RecoveringJob;
using pipetrain::coordinator::RecoveryPlan;
using pipetrain::coordinator::Scheduler;
using pipetrain::coordinator::StartGeneration;
namespace v1 = pipetrain::v1;

std::vector<v1::WorkerInfo> IdleWorkers(int n) {
  std::vector<v1::WorkerInfo> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].set_id("worker-" + std::to_string(i + 1));
    out[i].set_address("10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250) + ":7000");
    out[i].set_device("cpu");
    out[i].set_state(v1::WORKER_STATE_IDLE);
    out[i].set_memory_bytes(int64_t{64} << 30);
    out[i].set_cores(16);
  }
  return out;
}

// The median seconds of `call`, repeated for at least 0.2 s (and 5 times).
template <typename Call>
double MedianSeconds(Call call) {
  std::vector<double> times;
  const auto begun = std::chrono::steady_clock::now();
  while (times.size() < 5 ||
         std::chrono::steady_clock::now() - begun < std::chrono::milliseconds(200)) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {256, 1024, 4096};
  const Scheduler scheduler({absl::Seconds(1), 3});
  std::printf(
      "| workers (= ranks) | PlanQueue ms | ratio | PlanRecovery ms | ratio | layout after "
      "the loss |\n|---|---|---|---|---|---|\n");
  double last_queue = 0, last_recovery = 0;
  for (int n : sizes) {
    if (n < 16 || n % 8 != 0) {
      std::fprintf(stderr, "scheduler_scale: N must be a multiple of 8, at least 16\n");
      return 1;
    }
    const std::vector<v1::WorkerInfo> workers = IdleWorkers(n);
    const std::vector<QueuedJob> queued = {{"job-0001", n, 0, "cpu"}};
    volatile size_t sink = 0;
    const double queue_s = MedianSeconds([&] {
      const PlacementPlan plan = scheduler.PlanQueue(queued, workers);
      sink = sink + plan.started.size();
    });

    v1::Job job;
    v1::JobSpec& spec = *job.mutable_spec();
    spec.mutable_model()->set_name("gpt");
    spec.mutable_model()->set_n_layers(8);
    spec.set_schedule("1f1b");
    spec.set_stages(8);
    spec.set_replicas(n / 8);
    spec.set_microbatches(8);
    spec.set_steps(1000);
    spec.set_max_restarts(1);
    job.set_id("job-0001");
    job.set_stages(8);
    job.set_replicas(n / 8);
    job.set_steps(1000);
    job.set_generation(1);
    job.set_restarts(1);
    job.add_recoveries()->set_cause("worker-1 lost");
    const absl::StatusOr<pipetrain::job::JobSpec> config = pipetrain::job::Validated(spec);
    if (!config.ok()) {
      std::fprintf(stderr, "scheduler_scale: %s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    const std::vector<v1::WorkerInfo> survivors(workers.begin() + 1, workers.end());
    const absl::Time since = absl::FromUnixSeconds(1700000000);
    const RecoveringJob recovering{&job, &*config, since};
    std::string layout = "none";
    const double recovery_s = MedianSeconds([&] {
      const RecoveryPlan plan =
          scheduler.PlanRecovery(recovering, survivors, since + absl::Seconds(10));
      if (const auto* start = std::get_if<StartGeneration>(&plan)) {
        layout =
            std::to_string(start->layout.stages) + " x " + std::to_string(start->layout.replicas);
      }
    });
    auto ratio = [](double now, double before) {
      return before > 0 ? std::to_string(now / before).substr(0, 4) : std::string("");
    };
    std::printf("| %d | %.3f | %s | %.3f | %s | %s |\n", n, queue_s * 1e3,
                ratio(queue_s, last_queue).c_str(), recovery_s * 1e3,
                ratio(recovery_s, last_recovery).c_str(), layout.c_str());
    std::fflush(stdout);
    last_queue = queue_s;
    last_recovery = recovery_s;
  }
  return 0;
}
