// Which queued jobs start now, and on which workers (one rank per worker).
//
// Jobs are taken in submission order; a job starts when as many suitable workers as it has
// ranks are idle, rank r on the r-th suitable idle worker left, or, for a job with a host
// placer whose free workers are on several hosts, on the host the placer gives it (the
// hosts' workers in pool order; docs/planning.md "Hosts"). A worker suits a job when its
// device is of the job's kind (cpu, or cuda for a worker on "cuda" or "cuda:N") and it has at
// least the job's `min_cores` (its threads per stage; 0: any), or did not say how many it
// has. A job that does not fit waits, with the reason in words, and a later, smaller
// job that does fit starts before it (backfill). Pure: no clock, no lock, no I/O.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pipetrain/v1/job_service.pb.h"
#include "runtime/model/pipeline_layout.h"

namespace pipetrain::coordinator {

// The host of each of a job's ranks (rank = replica x stages + stage), an index into
// `free_per_host` (the workers each host has free for the job); a result of another size,
// or one that puts more ranks on a host than it has free, is not used (pool order instead).
using HostPlacer = std::function<std::vector<int>(const std::vector<int>& free_per_host)>;

struct QueuedJob {
  std::string id;
  int ranks = 0;               // stages x replicas: the workers it needs
  int min_cores = 0;           // cores each of them must have (0: any)
  std::string device = "cpu";  // cpu | cuda
  HostPlacer place_on_hosts;   // empty: pool order, whatever the hosts
};

struct PoolWorker {
  std::string id;
  int cores = 0;  // 0: unknown (suits every job)
  bool idle = true;
  std::string device = "cpu";  // as it registered: cpu, cuda, cuda:N
  std::string host;            // the machine it runs on, as it registered ("": unknown)
};

// A registered worker as placement sees it (idle when its state is).
PoolWorker PoolWorkerOf(const v1::WorkerInfo& info);

// "cuda" for "cuda" and "cuda:N", the device itself otherwise.
std::string DeviceKind(const std::string& device);

struct Placement {
  std::string job_id;
  std::vector<std::string> rank_workers;  // worker id of each rank
};

struct Waiting {
  std::string job_id;
  // "needs 4 workers, 2 idle" or, when the pool itself is short, "needs 4 workers with at
  // least 8 cores; the pool has 2 (1 idle): it waits for more to register".
  std::string reason;
};

struct PlacementPlan {
  std::vector<Placement> started;  // in submission order
  std::vector<Waiting> waiting;    // the jobs that do not fit, in submission order
};

// The layouts a job that ran as `original` may restart with on at most `workers` workers,
// best first: `original` if it fits; else every layout with at most as many stages and
// replicas and the same global batch (replicas x micro-batches unchanged, so the data order
// and the arithmetic stay the same; a changed stage count leaves the layers to be balanced), the
// most ranks first, then the most stages (the least memory per worker). With `stages_fixed`
// (explicit layer ranges) only the replicas change. Pure; the caller checks each against the job's
// other rules and takes the first that passes.
std::vector<model::PipelineLayout> RecoveryLayouts(const model::PipelineLayout& original,
                                                   int workers, bool stages_fixed);

// The workers for a job's `ranks` ranks among `free` (indices into `pool`, in the order to
// use them; at least `ranks`): by `place_on_hosts` when they are on several hosts and its
// answer is usable, else the first `ranks`. Indices into `pool`, rank by rank.
std::vector<size_t> RankWorkers(int ranks, const HostPlacer& place_on_hosts,
                                const std::vector<PoolWorker>& pool,
                                const std::vector<size_t>& free);

// `rank_workers` (a worker per rank, rank = replica x stages + stage) reordered so that as
// many ranks as can run on a worker that holds their stage's state already
// (`held_stage(worker)`: the stage, or -1), each rank keeping a worker of the host it had
// (`host_of(worker)`), so that a host placement stands; the others in the order they had.
// A survivor placed on its own stage again then copies nothing (replica_state_fetch.h).
std::vector<std::string> KeepStagesOnTheirHolders(
    const std::vector<std::string>& rank_workers, int stages,
    const std::function<int(const std::string&)>& held_stage,
    const std::function<std::string(const std::string&)>& host_of);

// `pool`: every worker that can run a stage (idle or busy; lost ones left out), in the order
// idle ones are to be used.
PlacementPlan PlaceQueuedJobs(const std::vector<QueuedJob>& queued_in_order,
                              const std::vector<PoolWorker>& pool);

}  // namespace pipetrain::coordinator
