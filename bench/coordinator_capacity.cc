// coordinator_capacity: how many worker RPCs a pipetrain-coordinator answers, and how fast.
//
// Simulates N workers against a running coordinator (--coordinator HOST:PORT), or against
// one it starts itself (--start-coordinator PATH: port 0, a fresh SQLite file in a temporary
// folder, killed at the end):
//   1. serves one WorkerService from a process of its own (AssignStage and StopStage answer
//      OK and do nothing) and registers N workers with it (RegisterWorker, each at an
//      address of its own on loopback, all served there);
//   2. submits one job of `--stages` stages x N / stages replicas, so that the coordinator
//      assigns one rank to each simulated worker (it needs every rank assigned before it
//      accepts step reports: ReportStep is refused for a job that is not running or a rank
//      out of range), and waits until all N AssignStage calls arrived;
//   3. for each client thread count T in --threads, for --seconds each, measures
//        Heartbeat   worker i (round robin over the N), with its job and rank, as a busy
//                    worker sends it every heartbeat interval;
//        ReportStep  rank r (round robin), the next step of that rank, with compute/wait
//                    totals and end time, and the loss on last-stage ranks, as a worker
//                    sends it after every step;
//        mixed       both, alternating, on every thread;
//      each thread with its own channel (its own TCP connection, as every worker has).
//      Printed: calls answered per second (all threads), and p50 / p99 latency of one call
//      as the client sees it (send to reply, including this process's own scheduling);
//   4. cancels the job and reports every rank's end, so the workers go idle again.
// Heartbeats that keep the simulated workers alive while a phase does not cover them are
// sent from threads of their own (Keepalive), from each worker's registration on, about
// twice per heartbeat interval per worker, and are not counted. With --scale, the cluster at
// its real cadence instead of step 3 (coordinator_capacity_scale.h). The simulated workers are in
// this process and use the same cores as the coordinator: on a 2-core machine the numbers are a
// lower bound. With $PIPETRAIN_TOKEN set, every call carries it ("authorization: Bearer ...").
//
//   coordinator_capacity --coordinator 127.0.0.1:7070 [--workers 64] [--stages 2]
//                        [--threads 1,8] [--seconds 3]
//   coordinator_capacity --start-coordinator build-bench/coordinator/pipetrain-coordinator
// Or bench/coordinator_capacity.sh, which starts a coordinator on a temporary database.
// Prints a markdown table on stdout. Against a coordinator of its own: the coordinator must
// have no other idle workers (the job's ranks must all come here).
// The parts: coordinator_capacity_options (the command line), coordinator_capacity_cluster
// (the coordinator, the simulated workers and their job), coordinator_capacity_phases (the
// measurements and their table).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "bench/coordinator_capacity_cluster.h"
#include "bench/coordinator_capacity_options.h"
#include "bench/coordinator_capacity_phases.h"
#include "bench/coordinator_capacity_scale.h"
#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/job_service.grpc.pb.h"

int main(int argc, char** argv) {
  using namespace pipetrain::bench::capacity;  // NOLINT: the benchmark's parts
  const Options options = ParseArgs(argc, argv);
  // 1. The simulated workers' service (a process of its own: first, before any gRPC here).
  FakeWorkers service;
  const int port = service.port();
  std::unique_ptr<OwnCoordinator> own;
  std::string target = options.coordinator;
  if (!options.start_coordinator.empty()) {
    own = std::make_unique<OwnCoordinator>(options.start_coordinator);
    target = own->address();
  }
  const int n = options.workers;

  // And N registrations.
  auto coordinator = v1::CoordinatorService::NewStub(OwnChannel(target));
  auto jobs = v1::JobService::NewStub(OwnChannel(target));
  Cluster cluster;
  cluster.stages = options.stages;
  cluster.Allocate(n);
  // Every simulated worker heartbeats as its own thread would, from its registration on.
  Keepalive keepalive(target, cluster, 16);
  if (options.submit_first) cluster.job_id = SubmitJobOverAll(*jobs, options.stages, n);
  const auto registering = Clock::now();
  RegisterSimulatedWorkers(target, port, n, options.register_per_s, cluster);
  const double registered_s = std::chrono::duration<double>(Clock::now() - registering).count();
  const pid_t coordinator_pid = own ? own->pid() : 0;
  std::fprintf(stderr,
               "registered %d workers in %.2f s (the longest wait for a heartbeat: %.0f ms); CPU "
               "s so far: coordinator %.2f, this process %.2f, the workers' service %.2f\n",
               n, registered_s, keepalive.TakeLongestGapMs(), ProcessCpuSeconds(coordinator_pid),
               ProcessCpuSeconds(getpid()), ProcessCpuSeconds(service.pid()));

  // 2. One job over all N simulated workers.
  const auto submitting = Clock::now();
  if (!options.submit_first) cluster.job_id = SubmitJobOverAll(*jobs, options.stages, n);
  WaitUntilAssigned(service, cluster.job_id, n);
  MapRanks(*jobs, cluster.job_id, cluster);
  keepalive.SetJob(cluster.job_id, cluster.rank_of_worker);
  const double placed_s = std::chrono::duration<double>(Clock::now() - submitting).count();
  std::fprintf(stderr,
               "placed in %.2f s (the longest wait for a heartbeat: %.0f ms; the longest "
               "heartbeat call: %.0f ms)\n",
               placed_s, keepalive.TakeLongestGapMs(), keepalive.TakeLongestCallMs());
  std::fprintf(stderr,
               "CPU s so far: coordinator %.2f, this process %.2f, the workers' service %.2f\n",
               ProcessCpuSeconds(coordinator_pid), ProcessCpuSeconds(getpid()),
               ProcessCpuSeconds(service.pid()));
  std::fprintf(stderr,
               "coordinator %s: %d simulated workers registered, job %s (%d stages x %d "
               "replicas) running on them\n",
               target.c_str(), n, cluster.job_id.c_str(), options.stages, n / options.stages);

  // 3. The measurements.
  if (!options.scale) {
    MeasureAndPrint(options, target, cluster);
    // 4. Cancel the job and end every rank, so the simulated workers are idle again.
    EndEveryRank(*jobs, *coordinator, cluster, n);
  } else {
    std::fprintf(stderr, "the cluster at its cadence for %.0f s (%d client threads)...\n",
                 options.seconds, options.cadence_threads);
    keepalive.SetPaused(true);  // the cadence heartbeats every worker itself
    const CadenceResult c = RunCadence(target, cluster, coordinator_pid, options.seconds,
                                       options.step_s, options.cadence_threads);
    keepalive.SetPaused(false);
    if (c.errors > 0) std::fprintf(stderr, "  first error: %s\n", c.first_error.c_str());
    const std::vector<ProbeResult> probes = RunProbes(target, cluster);
    const auto ending = Clock::now();
    EndEveryRank(*jobs, *coordinator, cluster, n);
    const double ended_s = std::chrono::duration<double>(Clock::now() - ending).count();
    // Cluster time: the calls made over those one second of the cluster asks for.
    const double per_second = n / (cluster.heartbeat_ms / 1000.0) + n / options.step_s;
    const double cluster_s = c.calls_made / per_second;
    std::printf(
        "| workers | register all | place the job | calls/s due | made / due | coordinator "
        "CPU s per cluster s | heartbeat p50 / p99 ms | step report p50 / p99 ms | %s ms "
        "(reply) | %s ms (reply) | end the job's ranks | errors |\n",
        probes[0].name.c_str(), probes[1].name.c_str());
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    std::printf(
        "| %d | %.2f s | %.2f s | %.0f | %.3f | %s | %.2f / %.2f | %.2f / %.2f | %.1f (%.0f kB) "
        "| %.1f (%.0f kB) | %.2f s | %lld |\n",
        n, registered_s, placed_s, per_second,
        c.calls_due > 0 ? static_cast<double>(c.calls_made) / c.calls_due : 0.0,
        c.coordinator_cpu_s >= 0
            ? std::to_string(c.coordinator_cpu_s / cluster_s).substr(0, 5).c_str()
            : "n/a",
        Percentile(c.heartbeat_us, 0.5) / 1e3, Percentile(c.heartbeat_us, 0.99) / 1e3,
        Percentile(c.report_us, 0.5) / 1e3, Percentile(c.report_us, 0.99) / 1e3,
        Percentile(probes[0].ms, 0.5), probes[0].reply_bytes / 1e3, Percentile(probes[1].ms, 0.5),
        probes[1].reply_bytes / 1e3, ended_s, static_cast<long long>(c.errors));
    std::printf(
        "\n%d simulated workers, one job of %d stages x %d replicas; %.0f s at the "
        "cadence (%.1f s of cluster time); heartbeat every %lld ms, a step every %.1f "
        "s.\n",
        n, options.stages, n / options.stages, c.seconds, cluster_s,
        static_cast<long long>(cluster.heartbeat_ms), options.step_s);
  }
  return 0;
}
