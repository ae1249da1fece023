// Where jobs run: the coordinator's scheduling decisions, apart from carrying them out.
//
//   PlanQueue      which queued jobs start now, on which idle workers (FIFO with backfill,
//                  placement.h; on several hosts where the job's traffic says, PlacerFor),
//                  from the registry's view of the workers;
//   PlanRecovery   what a recovering job does now: start its next generation (once its last
//                  one's ranks have ended, those on lost workers by their lease; the same
//                  layout once enough workers are idle, else after a grace of three heartbeat
//                  intervals the best smaller one whose ranks fit the workers' memory, as the
//                  planner's memory model counts a stage's weights), wait for workers (and
//                  whether it holds the idle ones meanwhile), or give up past its timeout;
//   PlanRetry      where a rank goes whose assignment failed: another idle worker while
//                  attempts are left and the first was unreachable, back to the queue (no
//                  worker to take it: a placement failure, not the job's), or the job's fault.
//
// The coordinator's dispatcher (dispatcher.h) gathers the inputs under its lock, asks, and
// applies the answer through the jobs' controllers and the worker pool.
// Pure: no clock (the time comes in), no lock, no I/O; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/placement.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/job_service.pb.h"
#include "runtime/job/job_spec.h"
#include "runtime/model/pipeline_layout.h"
#include "runtime/planner/profile.h"

namespace pipetrain::coordinator {

// Where a job's ranks go when the idle workers for it are on several hosts.
enum class HostPolicy {
  kTopology,  // the placement the simulation of the job's traffic prefers (job_traffic.h)
  kInOrder,   // the workers in the registry's order, whatever their hosts
};

struct SchedulerPolicy {
  // Recovery waits this many intervals for the workers of the job's own layout (workers that
  // come back) before it takes a smaller one.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  static constexpr int kRecoveryGraceIntervals = 3;
  // Assignments tried per rank (the first included) before it is given up.
  int assign_attempts = 3;
  HostPolicy host_policy = HostPolicy::kTopology;
  // The links between hosts as measured (pipetrain profile-link); not measured: assumed
  // (job_traffic.h).
  planner::HostLinks host_links;
};

// A job whose last generation a fault ended (job machine phase kRecovering).
struct RecoveringJob {
  const v1::Job* job = nullptr;          // its record (spec, checkpoint, restarts, ...)
  const job::JobSpec* config = nullptr;  // its spec, resolved
  absl::Time recovering_since;           // when its last generation ended
  // Until when a rank of it on a worker taken for lost may still run (that worker's lease):
  // the next generation waits for it.
  absl::Time lost_ranks_stop_by = absl::InfinitePast();
};

// ---- PlanRecovery's answers
struct StartGeneration {  // run the next generation now
  model::PipelineLayout layout;
  v1::JobSpec run_spec;                   // the spec with that layout and the resume point
  std::vector<std::string> rank_workers;  // worker of each rank (layout.ranks())
  int64_t start_step = 0;                 // the checkpoint's step; -1: the spec's resume_from
  // "only 3 workers: generation 2 runs ..." when the layout is smaller than the job's; "".
  std::string announcement;
};
struct WaitForWorkers {  // no layout yet
  std::string why;       // for the job's status ("recovering (restart 1 of 2): ...; waits for ...")
  // The idle workers are kept for this job (its old ranks still end, or it is within the
  // grace for its own layout): queued jobs wait. Otherwise they may start on them.
  bool holds_idle_workers = false;
};
struct GiveUp {  // no layout within the job's timeout_s: the job fails with this message
  std::string message;
};
using RecoveryPlan = std::variant<StartGeneration, WaitForWorkers, GiveUp>;

// ---- PlanRetry's answers
struct RetryOnWorker {  // assign the rank to this idle worker instead
  std::string worker_id;
};
struct NoWorkerForRank {};  // no worker can take it: the job waits in the queue (no restart)
struct RankRefused {};      // the worker refused it: the job's fault
using RetryPlan = std::variant<RetryOnWorker, NoWorkerForRank, RankRefused>;

// An assignment's error that says the worker could not be reached (it is then taken for lost).
bool IsUnreachable(const absl::Status& assignment_error);

// What one rank of `layout` holds for its parameters, for the largest stage, as the
// planner's memory model counts it (planner::WeightBytes: each parameter in its weight
// versions and the optimizer's state) plus its gradient, at the job's dtype. Activations are
// not counted (they need the model's profile). nullopt where it is not known without building
// the model (TorchScript).
std::optional<int64_t> RankParameterStateBytes(const job::JobSpec& config,
                                               const model::PipelineLayout& layout);

class Scheduler {
 public:
  explicit Scheduler(SchedulerPolicy policy) : policy_(policy) {}

  // `queued_in_order`: the durable queued jobs, oldest first; `workers`: the registry's view
  // (lost ones are left out here; idle ones are used in the order given).
  PlacementPlan PlanQueue(const std::vector<QueuedJob>& queued_in_order,
                          const std::vector<v1::WorkerInfo>& workers) const;
  // The same over the workers that are not lost, as WorkerPool::Placeable lists them.
  PlacementPlan PlanQueue(const std::vector<QueuedJob>& queued_in_order,
                          const std::vector<PoolWorker>& placeable) const;

  // `workers`: the registry's view; a worker still busy (or draining) with the job's id runs a
  // rank of its last generation, which must end before the next is placed, and so must the
  // leases of the lost ones (job.lost_ranks_stop_by).
  RecoveryPlan PlanRecovery(const RecoveringJob& job, const std::vector<v1::WorkerInfo>& workers,
                            absl::Time now) const;

  // The assignment of a rank failed with `error` after `attempts` tries in all;
  // `idle_of_kind`: the idle workers of the job's device kind, in the order to use them.
  RetryPlan PlanRetry(const absl::Status& error, int attempts,
                      const std::vector<std::string>& idle_of_kind) const;

  // How a job of `config` is put on hosts under this policy (empty: in the workers' order);
  // `config` must outlive the placer (job_traffic.h).
  HostPlacer PlacerFor(const job::JobSpec& config) const;

  const SchedulerPolicy& policy() const { return policy_; }

 private:
  SchedulerPolicy policy_;
};

}  // namespace pipetrain::coordinator
