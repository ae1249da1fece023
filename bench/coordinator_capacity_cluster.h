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
#include <thread>
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
  pid_t pid() const { return pid_; }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  std::string address_;
};

// The simulated workers' one WorkerService, in a process of its own (forked, so that the
// thousands of connections the coordinator opens to it do not take the CPU this process's
// simulated workers heartbeat with): it serves on every address of the host, takes every
// assignment and does nothing, and counts the assignments back through a pipe. Start it
// before anything else of gRPC in this process; it is killed on destruction (and with this
// process).
class FakeWorkers {
 public:
  FakeWorkers();  // Dies if it does not serve
  ~FakeWorkers();
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // AssignStage calls answered so far.
  int assigned();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int assigned_fd_ = -1;  // one byte per assignment
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
  // Sizes the per-worker state for `n` workers (before RegisterSimulatedWorkers and Keepalive).
  void Allocate(int n);
  // Per worker: registered yet (its id and session set).
  std::unique_ptr<std::atomic<bool>[]> registered;
  std::vector<std::string> worker_ids;
  std::vector<std::string> sessions;  // each worker's own credential (rpc::WorkerSession)
  std::string job_id;
  int stages = 0;
  std::atomic<int64_t> heartbeat_ms{1000};  // as registration answered
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
  // Rank `rank`'s next step report, as worker `worker` sends it after a step of
  // `compute_s` (and `wait_s` waiting): its totals, its end time, the loss on a last stage.
  // REQUIRES: rank_mu[rank] held until the report is sent (steps go in order).
  v1::StepReport NextReport(int worker, int rank, double compute_s, double wait_s) {
    v1::StepReport report;
    report.set_worker_id(worker_ids[worker]);
    report.set_job_id(job_id);
    report.set_rank(rank);
    const int64_t step = next_step[rank]++;
    report.set_step(step);
    if (rank % stages == stages - 1) {
      report.set_has_loss(true);
      report.set_loss(2.0);
    }
    report.set_compute_s(compute_s * (step + 1));
    report.set_wait_s(wait_s * (step + 1));
    report.set_end_s(MonotonicSeconds());
    return report;
  }
};

// Simulated worker i's address: 127.0.x.y:`port`, one of its own on loopback (a coordinator
// takes a second registration from one address for the restart of the first), all served by
// the benchmark's one WorkerService listening on every address at `port`.
std::string SimulatedWorkerAddress(int i, int port);

// Registers the `n` simulated workers of `cluster` (Allocate(n) first), worker i at
// SimulatedWorkerAddress(i, port), from several threads, filling its ids, sessions and
// heartbeat interval, and marking each registered; at most `per_s` a second (0: unpaced).
void RegisterSimulatedWorkers(const std::string& target, int port, int n, double per_s,
                              Cluster& cluster);

// Keeps the registered simulated workers alive as their own heartbeat threads would: from
// `threads` threads (each its own connection, a slice of the workers), a heartbeat for each
// worker that no other call covered in the last 0.8 interval, with its job and rank once
// SetJob has been called; none while paused (a phase that heartbeats every worker itself).
// Stops on destruction.
class Keepalive {
 public:
  Keepalive(const std::string& target, Cluster& cluster, int threads);
  ~Keepalive();
  void SetJob(const std::string& job_id, const std::vector<int>& rank_of_worker);
  void SetPaused(bool paused) { paused_.store(paused); }
  // The longest a worker has waited for its heartbeat since the last call (ms), and a new
  // count from now.
  double TakeLongestGapMs() { return longest_gap_ns_.exchange(0) / 1e6; }
  // The longest one heartbeat call took since the last call (ms), and a new count from now.
  double TakeLongestCallMs() { return longest_call_ns_.exchange(0) / 1e6; }

 private:
  void Loop(const std::string& target, int t, int threads);
  Cluster& cluster_;
  std::mutex mu_;  // guards job_id_, rank_of_worker_
  std::string job_id_;
  std::vector<int> rank_of_worker_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> paused_{false};
  std::atomic<int64_t> longest_gap_ns_{0};   // since a worker's last heartbeat, when sent
  std::atomic<int64_t> longest_call_ns_{0};  // one heartbeat call
  std::vector<std::thread> threads_;
};

// Submits one job of `stages` stages x n / stages replicas, so that its ranks take every
// simulated worker; returns its id.
std::string SubmitJobOverAll(v1::JobService::Stub& jobs, int stages, int n);
// Waits (120 s at most) until all n ranks of `job_id` are assigned.
void WaitUntilAssigned(FakeWorkers& workers, const std::string& job_id, int n);

// Where the coordinator placed each rank of `job_id`: fills `cluster`'s worker_of_rank and
// rank_of_worker from the job's stage table (Dies when a rank is on a worker not ours).
void MapRanks(v1::JobService::Stub& jobs, const std::string& job_id, Cluster& cluster);

// Cancels the job and ends every rank, so the simulated workers are idle again. Failures are
// printed, not fatal.
void EndEveryRank(v1::JobService::Stub& jobs, v1::CoordinatorService::Stub& coordinator,
                  const Cluster& cluster, int n);

}  // namespace pipetrain::bench::capacity
