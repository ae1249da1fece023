// The worker daemon: one per device. Serves WorkerService, registers with the coordinator,
// heartbeats, and runs at most one assigned stage at a time on the Gloo data plane,
// reporting every finished step and the stage's end.
//
// A stage is stopped (its transport aborted, so it leaves its current wait at once) when
// the coordinator says so, when a step report is answered with stop, or when the
// coordinator no longer knows this worker (heartbeat refused with NOT_FOUND: it restarted);
// the worker then registers again. Stop() (SIGTERM) while a rank runs first drains: the
// coordinator checkpoints the job at its earliest boundary and restarts it from there without
// this worker (CoordinatorService.DrainWorker), and the worker waits for its stage to be
// stopped that way (at most a minute). An assignment that arrives while the previous stage is
// on its way out (ended and reporting, or told to stop) waits for it, up to 8 s, instead of
// being refused: the coordinator counts the worker idle from its stage's end. Stop()
// drains: no new assignment is taken, a running stage is stopped and reported, and the
// worker leaves.
//
// Heartbeats carry the stage's current action and what it waits for, so that a stuck job
// shows who waits for whom. A worker whose heartbeats go unanswered for its lease (given at
// registration: three heartbeat intervals, while the coordinator takes a worker silent for
// two for lost) stops its stage, so that a worker cut off from the coordinator does not go
// on running a rank the coordinator has given up on.
//
// Step commands (flush, weight-version switch, checkpoint, stop at a named step) come to the
// worker that runs rank 0 (stage 0 of replica 0); its stage passes them on through the data
// plane (runtime/control/step_commands.h). At a checkpoint the ranks of replica 0 write their
// layers to the job's checkpoint.dir (a directory every worker of the job must share) and one
// of them commits it (runtime/checkpoint/job_checkpoints.h); that rank's next step report names it.
//
// After a fault, a survivor may be told to hold its state for the job's next generation
// (held_state.h): it serves those layers to the next generation's ranks (FetchLayerState,
// with the hold's key) until a heartbeat's answer no longer names the job, and counts their
// bytes in pipetrain_worker_memory_bytes{kind="held_state"}.
//
// Every assignment names the job's generation; the worker's heartbeats, step reports and
// stage end carry it, and a stop for another generation of the job leaves its stage alone.
//
// With a token in WorkerOptions::security, it sends the token with every call to the
// coordinator, and its server answers UNAUTHENTICATED, doing nothing, to calls without it
// (before they reach a handler: rpc/security.h). A coordinator
// that refuses its token fails Start at once (UNAUTHENTICATED; no retry). Whatever the
// token, its WorkerService takes calls only with the command key it registered with (only the
// coordinator has it), so no other holder of the join token can stop or assign its stage; and
// its address is not taken over by another registration while it answers there.
//
// Parts: WorkerService is served by a thin adapter (worker_service.h) over the handlers
// below; the one rank it runs at a time, with its stops and waits, is a StageSlot
// (stage_slot.h), and a StageHost (stage_host.h) builds, runs, measures and reports it.
// Every call to the coordinator goes through a CoordinatorClient (coordinator_client.h;
// gRPC unless Start is given another, as tests give a fake); a job's files are confined by
// data_roots.h. Time comes from an injected Clock (the wall clock unless Start is given one).
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "metrics/endpoint.h"
#include "metrics/metrics.h"
#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/security.h"
#include "runtime/base/clock.h"
#include "worker/coordinator_client.h"
#include "worker/held_state.h"
#include "worker/stage_host.h"
#include "worker/stage_slot.h"
#include "worker/worker_service.h"

namespace pipetrain::worker {

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string listen = "127.0.0.1:0";  // its WorkerService; port 0 picks a free one
  std::string device = "cpu";          // cpu, cuda (GPU 0) or cuda:N
  // The address it is reached at, by the coordinator (its WorkerService, on the port
  // --listen bound) and by its peers (its data plane binds there): "" for the host of
  // `listen`, or of `iface` when given (advertised_address.h).
  std::string advertise_address;
  // The interface peers reach it on: its address is advertised when advertise_address is
  // empty, and NCCL (NCCL_SOCKET_IFNAME, unless set) uses it. "": the one holding the
  // advertised address.
  std::string iface;
  // The machine it runs on, as registered (shown by `pipetrain workers`): --host-name, by
  // default Slurm's node name or the hostname (advertised_address.h, DefaultHostName).
  std::string host;
  rpc::SecurityOptions security;  // both ways: to the coordinator and of its callers
  // The only directories a job's files (data.path, model.path) may be read from, resolved
  // through symlinks; regular files only. None: a job may name no file at all. With roots, a
  // job's checkpoint.dir, weights_dir and resume_from must lie under them or under the
  // worker's own checkpoints/ (WritableRoots), and the process reads files only there
  // (runtime/base/regular_file.h: SetReadRoots, checked on what was opened).
  std::vector<std::string> data_roots;
  // Where GET /metrics is served (Prometheus text format); port 0 picks a free one, "" none.
  std::string metrics_listen = "127.0.0.1:0";
};

class Worker {
 public:
  // Serves, then registers (retrying for up to `register_timeout`; not when the coordinator
  // refuses the token, Unauthenticated, or what the worker says of itself, such as an
  // address nobody else can reach: InvalidArgument or FailedPrecondition). Calls the coordinator
  // through `coordinator` if given (tests: a fake), else over gRPC to options.coordinator;
  // reads time from `clock` if given, else the wall clock.
  static absl::StatusOr<std::unique_ptr<Worker>> Start(
      const WorkerOptions& options, absl::Duration register_timeout,
      std::shared_ptr<CoordinatorClient> coordinator = nullptr,
      std::shared_ptr<const Clock> clock = nullptr);
  ~Worker();
  void Stop();
  std::string id() const;
  // host:port its WorkerService serves on (the bound port, when port 0 was asked for).
  const std::string& address() const { return address_; }
  // host:port of its /metrics endpoint ("" if none).
  std::string metrics_address() const {
    return metrics_endpoint_ ? metrics_endpoint_->address() : "";
  }

  // The handlers behind WorkerService (worker_service.h checks the command key first).
  // Starts `assignment`'s rank on a thread of its own. OK for the same assignment again (a
  // retried call); FailedPrecondition while another rank runs or before registering (an
  // assignment may arrive before the registration's answer: waited for up to 5 s);
  // Unavailable while draining.
  absl::Status Assign(const v1::StageAssignment& assignment);
  // Stops the running rank if it is of the request's job and generation (0: any).
  void StopRank(const v1::StopStageRequest& request);
  // Rank 0 only: queues the command for its stage, which passes it to every other stage;
  // the boundary it takes effect at.
  absl::StatusOr<int64_t> ScheduleCommand(const v1::SendCommandRequest& request);

 private:
  Worker(WorkerOptions options, std::shared_ptr<const Clock> clock);
  absl::Status Register(absl::Time deadline);
  void HeartbeatLoop();
  // REQUIRES: mu_ held. Stops the running stage, saying why (its lease ran out).
  void LeaseExpired();
  // Stop()'s first part while a rank runs: asks the coordinator to drain this worker and,
  // if it scheduled a checkpoint, waits (heartbeating, up to kDrainTimeout) until the
  // coordinator has stopped the stage after that checkpoint.
  void Drain();
  static constexpr absl::Duration kDrainTimeout = absl::Seconds(60);
  // How long an assignment waits for the previous rank on its way out.
  static constexpr absl::Duration kEndingPatience = absl::Seconds(8);

  WorkerOptions options_;
  const std::shared_ptr<const Clock> clock_;
  metrics::Registry metrics_;  // before what feeds it, after what serves it (below)
  std::unique_ptr<metrics::MetricsEndpoint> metrics_endpoint_;
  // The rank it runs (thread-safe); before the host and the server that use it, so that it
  // is destroyed after them: its Shutdown in Stop() has ended the stage's thread by then.
  StageSlot slot_;
  // The survivors' state it holds for a job's next generation (thread-safe); before the host
  // and the server that use it. Heartbeat answers say which jobs' to keep.
  HeldStates held_;
  std::unique_ptr<StageHost> host_;
  std::unique_ptr<WorkerServiceAdapter> service_;  // before the server that calls it
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<CoordinatorClient> coordinator_;
  // This worker's credential with the coordinator, set at every registration; the
  // coordinator channel sends it with every call.
  std::shared_ptr<rpc::WorkerSession> session_ = std::make_shared<rpc::WorkerSession>();
  // The coordinator's credential with this worker (rpc/security.h): made once, sent only to
  // the coordinator, in every registration.
  const std::string command_key_ = rpc::RandomKey();
  // Guards the registration (id_, heartbeat_interval_, lease_, heard_at_) and the lifecycle
  // flags; cv_ wakes an assignment waiting for the id and the heartbeat loop at a stop.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string id_;
  absl::Duration heartbeat_interval_ = absl::Seconds(1);
  // The lease the coordinator gave at registration (0: none) and when the last heartbeat it
  // answered was sent: once no heartbeat has been answered for the lease, the running stage
  // is stopped (LeaseExpired), since the coordinator has taken this worker for lost.
  absl::Duration lease_ = absl::ZeroDuration();
  absl::Time heard_at_;
  bool stopping_ = false;
  bool draining_ = false;  // Stop() has begun: no new assignment
  std::thread heartbeat_thread_;
};

}  // namespace pipetrain::worker
