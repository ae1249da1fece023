// coordinator_capacity: how many worker RPCs a pipetrain-coordinator answers, and how fast.
//
// Simulates N workers against a running coordinator (--coordinator HOST:PORT), or against
// one it starts itself (--start-coordinator PATH: port 0, a fresh SQLite file in a temporary
// folder, killed at the end):
//   1. serves one WorkerService (AssignStage and StopStage answer OK and do nothing) and
//      registers N workers with it (RegisterWorker, all at that one address);
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
// sent from a separate thread, at most once per heartbeat interval per worker (as real
// workers do), and are not counted. The simulated workers are in this process and use the
// same cores as the coordinator: on a 2-core machine the numbers are a lower bound.
// With $PIPETRAIN_TOKEN set, every call carries it ("authorization: Bearer ...").
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
#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/job_service.grpc.pb.h"

int main(int argc, char** argv) {
  using namespace pipetrain::bench::capacity;  // NOLINT: the benchmark's parts
  const Options options = ParseArgs(argc, argv);
  std::unique_ptr<OwnCoordinator> own;
  std::string target = options.coordinator;
  if (!options.start_coordinator.empty()) {
    own = std::make_unique<OwnCoordinator>(options.start_coordinator);
    target = own->address();
  }
  const int n = options.workers;

  // 1. The simulated workers' service, and N registrations.
  FakeWorkerService service;
  grpc::ServerBuilder builder;
  int port = 0;
  // On every address of the host: each simulated worker registers an address of its own on
  // loopback (127.0.x.y, SimulatedWorkerAddress), as distinct workers do, all served here.
  builder.AddListeningPort("0.0.0.0:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) Die("cannot serve the simulated workers' WorkerService");

  auto coordinator = v1::CoordinatorService::NewStub(OwnChannel(target));
  auto jobs = v1::JobService::NewStub(OwnChannel(target));
  Cluster cluster;
  cluster.stages = options.stages;
  RegisterSimulatedWorkers(*coordinator, target, port, n, cluster);

  // Keeps every simulated worker alive: a heartbeat once per interval for each worker that
  // no measured call covered in the last interval.
  std::atomic<bool> stopping{false};
  std::mutex job_mu;  // guards cluster.job_id and rank_of_worker while the keepalive runs
  std::thread keepalive([&] {
    auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
    const int64_t interval_ns = cluster.heartbeat_ms * 1000000;
    while (!stopping.load()) {
      std::string job_id;
      std::vector<int> rank_of_worker;
      {
        std::lock_guard<std::mutex> lock(job_mu);
        job_id = cluster.job_id;
        rank_of_worker = cluster.rank_of_worker;
      }
      for (int i = 0; i < n && !stopping.load(); ++i) {
        if (NowNs() - cluster.last_heartbeat[i].load() < interval_ns) continue;
        grpc::ClientContext ctx;
        Prepare(&ctx);
        cluster.As(i, &ctx);
        v1::HeartbeatRequest request;
        request.set_worker_id(cluster.worker_ids[i]);
        request.set_job_id(job_id);
        request.set_rank(job_id.empty() ? -1 : rank_of_worker[i]);
        v1::HeartbeatResponse response;
        (void)stub->Heartbeat(&ctx, request, &response);
        cluster.last_heartbeat[i].store(NowNs());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(5, cluster.heartbeat_ms / 10)));
    }
  });

  // 2. One job over all N simulated workers.
  {
    const std::string job_id = SubmitJobOverAll(*jobs, service, options.stages, n);
    Cluster placed;
    placed.worker_ids = cluster.worker_ids;
    MapRanks(*jobs, job_id, placed);
    std::lock_guard<std::mutex> lock(job_mu);
    cluster.job_id = job_id;
    cluster.worker_of_rank = placed.worker_of_rank;
    cluster.rank_of_worker = placed.rank_of_worker;
  }
  std::fprintf(stderr,
               "coordinator %s: %d simulated workers registered, job %s (%d stages x %d "
               "replicas) running on them\n",
               target.c_str(), n, cluster.job_id.c_str(), options.stages, n / options.stages);

  // 3. The measurements.
  MeasureAndPrint(options, target, cluster);

  // 4. Cancel the job and end every rank, so the simulated workers are idle again.
  EndEveryRank(*jobs, *coordinator, cluster, n);
  stopping.store(true);
  keepalive.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
