// The coordinator's side of its workers (CoordinatorService, but for the ranks' reports:
// report_manager.h): registration (address and key checks, taking over an address only from
// a worker that no longer answers, ids numbered in the store), sessions, heartbeats (a stage
// that outlived its job is stopped again; the answer names the survivors' state to keep
// holding), drain, the rendezvous store a running rank meets in, the monitor's pass over the
// pool (silent workers lost, lost ones forgotten), and a worker lost (its rank's loss goes
// to its job's controller).
//
// Thread-safe: each call takes the coordinator's lock as it needs it, never across a call to
// a worker.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/command_relay.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/dispatcher.h"
#include "coordinator/worker_client.h"
#include "pipetrain/v1/coordinator_service.pb.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::coordinator {

class WorkerManager {
 public:
  // `state` and `dispatcher` (borrowed) outlive this; `connect` makes a worker's client. It
  // becomes the pool's lost-worker listener.
  WorkerManager(CoordinatorState& state, Dispatcher& dispatcher, WorkerConnector connect);

  // Registering gives a worker its own session (the response's
  // `session`); every other call names the session it came with (rpc::WorkerSession), and
  // may speak only for that worker and for the ranks assigned to it: an unknown session is
  // NotFound (the worker registers again), another worker's id or a rank or job not assigned
  // to it is PermissionDenied, and nothing is changed.
  // A worker registering from the address of one already known replaces it (a worker that
  // restarted on a fixed port): the old entry's rank, if any, is lost.
  // `peer`: where the call came from, as gRPC names it ("ipv4:10.0.0.2:5555"; "" unknown).
  // An address that cannot be reached is refused: a wildcard (InvalidArgument), or a
  // loopback address registered from another host (FailedPrecondition); both name the
  // worker's flags that fix it.
  absl::StatusOr<v1::RegisterWorkerResponse> Register(const v1::RegisterWorkerRequest& request,
                                                      const std::string& peer = "");
  // A worker stopping on purpose leaves the pool (a rank it still ran is lost).
  absl::Status Deregister(const std::string& session, const v1::DeregisterWorkerRequest& request);
  // The answer names the jobs whose survivors' state the worker should keep holding.
  absl::Status Heartbeat(const std::string& session, const v1::HeartbeatRequest& request,
                         v1::HeartbeatResponse* response = nullptr);
  // The worker is draining (CoordinatorService.DrainWorker): no rank is given to it any more;
  // if it runs a rank of a running job with restarts left, a checkpoint is scheduled at the
  // job's earliest boundary N (through rank 0's worker, as SendCommand does), and once the
  // checkpoint before N is the job's restart point the job restarts from it (its generation
  // ends, so this worker's stage is stopped). Returns N, or 0 when there is nothing to wait
  // for (the worker stops at once).
  absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(const std::string& session,
                                                      const v1::DrainWorkerRequest& request);
  // The key-value store the ranks of running job `job_id` meet in (the KV RPCs): only for a
  // worker that runs one of its ranks, of the job's current `generation` (a rank of an ended
  // one is refused: FailedPrecondition). Bounded as rendezvous_stores.h says.
  absl::StatusOr<std::shared_ptr<rendezvous::KeyValueStore>> Rendezvous(const std::string& session,
                                                                        const std::string& job_id,
                                                                        int generation);
  static constexpr size_t kKvValueBytes = RendezvousStores::kValueBytes;
  static constexpr size_t kKvKeyBytes = RendezvousStores::kKeyBytes;
  static constexpr int kMaxWorkerCores = 65536;
  // Worker numbers are reserved from the store this many at a time (NextWorkerNumber).
  static constexpr int64_t kWorkerNumberBlock = 64;
  // The workers, as the pool lists them.
  std::vector<v1::WorkerInfo> Workers() ABSL_LOCKS_EXCLUDED(state_.mu);
  // The monitor's pass over the pool at the clock's time: workers silent for two heartbeat
  // intervals are lost (failing their ranks), workers lost for options.lost_worker_ttl
  // forgotten. Under the lock.
  void Tick();
  // Workers lost for missed heartbeats since the start, for /metrics. Under the lock.
  int64_t lost_silent() const;
  // This process did not run for `stalled` (stopped, swapped out, starved of CPU: its monitor
  // woke that much later than it asked to): that time is not counted as any worker's silence
  // (WorkerPool::ExcuseSilence), so a stall of the coordinator declares no worker lost. A
  // worker that stays silent after it is still lost two intervals later. Under the lock.
  void CoordinatorStalled(absl::Duration stalled);
  // Stalls excused so far, for /metrics and tests. Under the lock.
  int64_t stalls_excused() const;

  // A worker's lease, in heartbeat intervals: one that has had no heartbeat answered for this
  // long stops its stage (it was taken for lost after two intervals without a heartbeat).
  static constexpr int kLeaseIntervals = 3;

 private:
  // The pool's lost-worker listener (every loss comes here, under the lock): says so, and
  // hands the loss to the controller of the job whose rank the worker ran.
  void OnWorkerLost(const WorkerPool::Lost& lost) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // The jobs whose held state `worker_id` holds and should keep (HeartbeatResponse); forgets
  // held states no longer needed (the job committed their step, or ended).
  std::vector<std::string> HeldStateJobsOf(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  // Worker numbers, reserved from the store kWorkerNumberBlock at a time (one durable write
  // per block, not per registration: thousands of workers register within seconds); a
  // restart starts a new block, so a number is never given twice.
  absl::StatusOr<int64_t> NextWorkerNumber() ABSL_LOCKS_EXCLUDED(state_.mu);

  CoordinatorState& state_;
  Dispatcher& dispatcher_;
  const WorkerConnector connect_;
  int64_t next_worker_ ABSL_GUARDED_BY(state_.mu) = 0;
  absl::Mutex numbers_mu_;
  int64_t number_next_ ABSL_GUARDED_BY(numbers_mu_) = 1;
  int64_t number_end_ ABSL_GUARDED_BY(numbers_mu_) = 0;
  int64_t workers_lost_silent_ ABSL_GUARDED_BY(state_.mu) = 0;
  int64_t stalls_excused_ ABSL_GUARDED_BY(state_.mu) = 0;
};

}  // namespace pipetrain::coordinator
