// The coordinator's worker registry: identity, address, state (idle, busy, draining, lost), the
// rank each one runs, and liveness (a worker silent for longer than the limit is lost). Each
// loss, whatever its cause, is told to the one lost-worker listener (the coordinator fails
// the rank the worker ran), so no path that loses a worker can forget its rank.
// Not thread-safe: the coordinator holds its lock around every call, and the listener runs
// under it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/placement.h"
#include "coordinator/worker_client.h"
#include "pipetrain/v1/job_service.pb.h"

namespace pipetrain::coordinator {

class WorkerPool {
 public:
  struct Worker {
    v1::WorkerInfo info;  // id, address, device, memory, state, job_id, rank
    absl::Time last_heartbeat;
    std::shared_ptr<WorkerClient> client;
    std::string session;  // its credential for the calls it makes (rpc::WorkerSession)
    absl::Time lost_at = absl::InfinitePast();  // when it was marked lost
    int generation = 0;                         // of the job whose rank it runs (info.job_id)
  };
  struct Lost {
    std::string id, address, job_id;
    int rank = -1;          // the rank it ran, -1 if idle
    absl::Duration silent;  // since its last heartbeat
    int generation = 0;     // of that rank's job
    std::string why;  // "stopped sending heartbeats (none for 4s)", "stopped (it was shut down)"
  };
  using LostListener = std::function<void(const Lost&)>;

  // Called with every worker marked lost, after it is marked.
  void SetLostListener(LostListener listener) { on_lost_ = std::move(listener); }

  // Adds an idle worker (info.id and a fresh session set by the caller).
  Worker& Add(v1::WorkerInfo info, std::shared_ptr<WorkerClient> client, std::string session,
              absl::Time now);
  // nullptr if unknown.
  Worker* Find(const std::string& id);
  // The worker holding `session`; nullptr if none (or `session` is empty).
  Worker* FindBySession(const std::string& session);
  // The worker whose service is at `address`; nullptr if none.
  Worker* FindByAddress(const std::string& address);
  // Forgets the worker (its session too).
  void Remove(const std::string& id);
  // Lost at `now` (unreachable, restarted, shut down, or silent), for `why`: never chosen
  // again (it must register again); the listener hears of it with the rank it ran. Release
  // a worker first whose rank the caller moves elsewhere.
  void MarkLost(Worker& worker, absl::Time now, const std::string& why);
  // Removes the workers lost for longer than `ttl`; returns their ids.
  std::vector<std::string> RemoveLostFor(absl::Time now, absl::Duration ttl);
  // Records a heartbeat at `now`; NotFound ("register again") for an unknown or lost worker.
  absl::StatusOr<Worker*> Heartbeat(const std::string& id, absl::Time now);
  // Ids of the idle workers, in id order.
  std::vector<std::string> IdleIds() const;
  void Assign(Worker& worker, const std::string& job_id, int rank, int generation);
  // Idle again (after its rank ended), unless lost; a draining worker stays draining.
  void Release(Worker& worker);
  // Draining (stopping on purpose): never chosen again; it keeps the rank it runs until it
  // ends.
  void MarkDraining(Worker& worker);
  // Marks lost every live worker whose last heartbeat is more than `limit` before `now`;
  // how many.
  int ExpireSilent(absl::Time now, absl::Duration limit);
  // The coordinator did not run for `stalled` up to `now`: every live worker's last heartbeat
  // moves `stalled` later (never past `now`), so that time does not count as its silence;
  // how many live workers.
  int ExcuseSilence(absl::Duration stalled, absl::Time now);
  // When the next live worker will have been silent for more than `limit`
  // (InfiniteFuture if none is live).
  absl::Time NextExpiry(absl::Duration limit) const;
  std::vector<v1::WorkerInfo> Infos() const;
  // Every worker that is not lost, as placement sees it (without copying the records: the
  // queue is planned on every registration).
  std::vector<PoolWorker> Placeable() const;

 private:
  std::map<std::string, Worker> workers_;
  std::map<std::string, std::string> by_session_;  // session -> worker id
  std::map<std::string, std::string> by_address_;  // address -> worker id (one each)
  LostListener on_lost_;
};

}  // namespace pipetrain::coordinator
