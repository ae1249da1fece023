// coordinator_capacity's side of the cluster: a coordinator of its own (or none), the one
// WorkerService its simulated workers share, their registrations and credentials, the job
// over all of them, and the calls that end it. A call the benchmark cannot do without Dies
// (coordinator_capacity_options.h) when it fails; every call carries $PIPETRAIN_TOKEN when
// it is set.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/job_service.grpc.pb.h"
#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/security.h"

namespace pipetrain::bench::capacity {

namespace v1 = pipetrain::v1;
namespace rpc = pipetrain::rpc;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A pipetrain-coordinator of our own (port 0, a fresh SQLite file in a temporary folder);
// the constructor Dies if it does not start, the destructor stops it (SIGTERM, then SIGKILL
// after 10 s) and removes the folder.
class OwnCoordinator {
 public:
  explicit OwnCoordinator(const std::string& binary);
  ~OwnCoordinator();
  const std::string& address() const { return address_; }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  std::string address_;
};

// The simulated workers' one WorkerService: takes every assignment, does nothing.
// Thread-safe (gRPC calls it from its threads).
class FakeWorkerService final : public v1::WorkerService::Service {
 public:
  grpc::Status AssignStage(grpc::ServerContext*, const v1::StageAssignment* request,
                           v1::AssignResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    job_id_ = request->job_id();
    ++assigned_;
    return grpc::Status::OK;
  }
  grpc::Status StopStage(grpc::ServerContext*, const v1::StopStageRequest*,
                         v1::AssignResponse*) override {
    return grpc::Status::OK;
  }
  int assigned() {
    std::lock_guard<std::mutex> lock(mu_);
    return assigned_;
  }

 private:
  std::mutex mu_;
  std::string job_id_;
  int assigned_ = 0;
};

// `ctx` with a deadline `seconds` from now and, when $PIPETRAIN_TOKEN is set, the token.
void Prepare(grpc::ClientContext* ctx, double seconds = 5);

// A channel with its own connection (gRPC otherwise shares one per target in a process).
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target);

// Steady-clock seconds, as a worker reports a step's end.
double MonotonicSeconds();

// Steady-clock nanoseconds since the clock's epoch.
int64_t NowNs();

struct Cluster {
  std::vector<std::string> worker_ids;
  std::vector<std::string> sessions;  // each worker's own credential (rpc::WorkerSession)
  std::string job_id;
  int stages = 0;
  int64_t heartbeat_ms = 1000;
  // Per worker: when its last heartbeat was sent (ns since the clock's epoch).
  std::unique_ptr<std::atomic<int64_t>[]> last_heartbeat;
  // Per rank: the next step to report, under the rank's lock (the coordinator takes a rank's
  // steps only in order, so two threads must not race for one rank).
  std::unique_ptr<int64_t[]> next_step;
  std::unique_ptr<std::mutex[]> rank_mu;
  // Once the job runs: the worker (index into worker_ids) each rank was placed on, and the
  // rank each worker runs, as the coordinator placed them (MapRanks).
  std::vector<int> worker_of_rank;
  std::vector<int> rank_of_worker;
  // Sends as worker i.
  void As(int i, grpc::ClientContext* ctx) const {
    ctx->AddMetadata(rpc::WorkerSession::kHeader, sessions[i]);
  }
};

// Simulated worker i's address: 127.0.x.y:`port`, one of its own on loopback (a coordinator
// takes a second registration from one address for the restart of the first), all served by
// the benchmark's one WorkerService listening on every address at `port`.
std::string SimulatedWorkerAddress(int i, int port);

// Registers `n` simulated workers, worker i at SimulatedWorkerAddress(i, port), filling
// `cluster`'s worker ids, sessions, heartbeat interval and per-worker state.
void RegisterSimulatedWorkers(v1::CoordinatorService::Stub& coordinator,
                              const std::string& target, int port, int n, Cluster& cluster);

// Submits one job of `stages` stages x n / stages replicas, so that its ranks take every
// simulated worker, and waits (30 s at most) until all are assigned; returns its id.
std::string SubmitJobOverAll(v1::JobService::Stub& jobs, FakeWorkerService& service,
                             int stages, int n);

// Where the coordinator placed each rank of `job_id`: fills `cluster`'s worker_of_rank and
// rank_of_worker from the job's stage table (Dies when a rank is on a worker not ours).
void MapRanks(v1::JobService::Stub& jobs, const std::string& job_id, Cluster& cluster);

// Cancels the job and ends every rank, so the simulated workers are idle again. Failures are
// printed, not fatal.
void EndEveryRank(v1::JobService::Stub& jobs, v1::CoordinatorService::Stub& coordinator,
                  const Cluster& cluster, int n);

}  // namespace pipetrain::bench::capacity
