// The coordinator's scheduling decisions. See scheduler.h.
#include "coordinator/scheduler.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job_traffic.h"
#include "runtime/job/job_spec.h"
#include "runtime/model/model_config.h"
#include "runtime/model/partition.h"
#include "runtime/planner/predict.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::coordinator {
namespace {

// The last fault's cause, for messages.
std::string LastCause(const v1::Job& job) {
  return job.recoveries().empty() ? std::string("?")
                                  : job.recoveries(job.recoveries_size() - 1).cause();
}

}  // namespace

bool IsUnreachable(const absl::Status& error) {
  return absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error);
}

std::optional<int64_t> RankParameterStateBytes(const job::JobSpec& c,
                                               const model::PipelineLayout& layout) {
  absl::StatusOr<std::vector<model::LayerInfo>> layers = model::BuiltinLayers(ModelSizedByData(c));
  if (!layers.ok()) return std::nullopt;
  std::vector<double> counts;
  for (const model::LayerInfo& l : *layers) counts.push_back(static_cast<double>(l.num_parameters));
  // The layout's own layers, else balanced as the job will be.
  const std::optional<std::vector<model::LayerRange>> ranges = StageRanges(layout, *layers);
  if (!ranges) return std::nullopt;
  double largest = 0;
  for (const model::LayerRange& r : *ranges) {
    double sum = 0;
    for (int i = r.begin; i < r.end && i < static_cast<int>(counts.size()); ++i) sum += counts[i];
    largest = std::max(largest, sum);
  }
  const int element =
      job::PrecisionOf(c) == job::Precision::kFloat64 ? 8 : 4;  // bf16 keeps fp32 weights
  const int64_t parameter_bytes = static_cast<int64_t>(largest) * element;
  // The planner's model of a stage's weights, and its gradient.
  // Stage 0 keeps the most versions (pipedream).
  const int versions =
      planner::WeightVersions(job::ScheduleOf(c), layout.stages, 0, layout.micro_batches);
  return planner::WeightBytes(
             versions, parameter_bytes,
             weights::OptimizerStateCopies(job::OptimizerConfigOf(c)) * parameter_bytes) +
         parameter_bytes;
}

HostPlacer Scheduler::PlacerFor(const job::JobSpec& config) const {
  if (policy_.host_policy == HostPolicy::kInOrder) return {};
  return MakeHostPlacer(config, policy_.host_links);
}

PlacementPlan Scheduler::PlanQueue(const std::vector<QueuedJob>& queued_in_order,
                                   const std::vector<v1::WorkerInfo>& workers) const {
  std::vector<PoolWorker> pool;
  for (const v1::WorkerInfo& w : workers) {
    if (w.state() != v1::WORKER_STATE_LOST) {
      pool.push_back(PoolWorkerOf(w));
    }
  }
  return PlanQueue(queued_in_order, pool);
}

PlacementPlan Scheduler::PlanQueue(const std::vector<QueuedJob>& queued_in_order,
                                   const std::vector<PoolWorker>& placeable) const {
  return PlaceQueuedJobs(queued_in_order, placeable);
}

RecoveryPlan Scheduler::PlanRecovery(const RecoveringJob& r,
                                     const std::vector<v1::WorkerInfo>& workers,
                                     absl::Time now) const {
  const v1::Job& job = *r.job;
  const job::JobSpec& c = *r.config;
  // Every rank of the last generation has ended (its worker reported it, or was lost).
  bool ending = false;
  for (const v1::WorkerInfo& w : workers) {
    if ((w.state() == v1::WORKER_STATE_BUSY || w.state() == v1::WORKER_STATE_DRAINING) &&
        w.job_id() == job.id()) {
      ending = true;
    }
  }
  // A rank on a worker taken for lost may still run (cut off from here, not from its peers)
  // until its lease ends: it stops then by itself.
  const bool lease_left = now < r.lost_ranks_stop_by;
  // (Said without a countdown: the job's message changes only when the situation does.)
  const std::string lease_note =
      lease_left ? ", a lost worker's lease first (it may still run its rank until then)" : "";
  const int min_cores = c.threads_per_stage();
  std::vector<const v1::WorkerInfo*> idle;
  for (const v1::WorkerInfo& w : workers) {
    if (w.state() == v1::WORKER_STATE_IDLE && DeviceKind(w.device()) == DeviceKind(c.device()) &&
        (min_cores <= 0 || w.cores() <= 0 || w.cores() >= min_cores)) {
      idle.push_back(&w);
    }
  }
  const v1::JobSpec& spec = job.spec();
  const model::PipelineLayout original = job::PipelineLayoutOf(c);
  const bool full = static_cast<int>(idle.size()) >= original.ranks();
  const bool grace_over = now - r.recovering_since >=
                          SchedulerPolicy::kRecoveryGraceIntervals * policy_.heartbeat_interval;
  std::string too_small;  // why layouts were passed over, for the job's message
  if (!ending && !lease_left && (full || grace_over)) {
    for (const model::PipelineLayout& l :
         RecoveryLayouts(original, static_cast<int>(idle.size()), spec.stage_ranges_size() > 0)) {
      // Only workers whose memory holds a rank's parameter state (when both are known).
      const std::optional<int64_t> need = RankParameterStateBytes(c, l);
      std::vector<PoolWorker> fit;
      for (const v1::WorkerInfo* w : idle) {
        if (!need || w->memory_bytes() <= 0 || w->memory_bytes() >= *need) {
          fit.push_back(PoolWorkerOf(*w));
        }
      }
      if (static_cast<int>(fit.size()) < l.ranks()) {
        too_small = absl::StrCat("; ", l.stages, " stages x ", l.replicas, " replicas need ",
                                 l.ranks(), " workers with ", need.value_or(0),
                                 " bytes for a rank's parameters, gradients and optimizer "
                                 "state, ",
                                 fit.size(), " idle have them");
        continue;
      }
      v1::JobSpec run = spec;
      if (l.stages != original.stages) {
        run.clear_stage_ranges();
        run.set_stages(l.stages);
      }
      run.set_replicas(l.replicas);
      run.set_microbatches(l.micro_batches);
      if (job.checkpoint_step() > 0) run.set_resume_from(job.checkpoint_path());
      absl::StatusOr<job::JobSpec> run_config = job::Validated(run);
      if (!run_config.ok()) continue;
      StartGeneration start;
      start.layout = l;
      start.start_step =
          job.checkpoint_step() > 0 ? job.checkpoint_step() : (run.has_resume_from() ? -1 : 0);
      start.run_spec = std::move(run);
      std::vector<size_t> all(fit.size());
      for (size_t i = 0; i < fit.size(); ++i) all[i] = i;
      for (const size_t i : RankWorkers(l.ranks(), PlacerFor(*run_config), fit, all)) {
        start.rank_workers.push_back(fit[i].id);
      }
      if (l.stages != original.stages || l.replicas != original.replicas) {
        start.announcement =
            absl::StrCat("only ", idle.size(), " workers: generation ", job.generation() + 1,
                         " runs ", l.stages, " stages x ", l.replicas, " replicas x ",
                         l.micro_batches, " micro-batches (the global batch unchanged)");
      }
      return start;
    }
  }
  const absl::Duration limit = absl::Seconds(c.timeout_s());
  if (now - r.recovering_since > limit) {
    return GiveUp{absl::StrCat("no workers to restart on within timeout_s (",
                               absl::FormatDuration(limit), "): ", idle.size(), " idle",
                               ending ? ", ranks of the last generation still ending" : "",
                               lease_note, too_small, "; it ran ", job.step() + 1, " of ",
                               job.steps(), " steps; the last fault: ", LastCause(job))};
  }
  WaitForWorkers wait;
  wait.why = absl::StrCat(
      "recovering (restart ", job.restarts(), " of ", c.max_restarts(), "): ", LastCause(job),
      "; waits for workers to restart on: ", idle.size(), " idle",
      ending ? ", ranks of the last generation still ending" : "", lease_note,
      !grace_over && !ending && !lease_left ? ", the same layout for 3 heartbeats" : "", too_small,
      "; up to timeout_s (", absl::FormatDuration(limit), ") in all");
  // The idle workers are kept for it only while it is about to take them (its old ranks
  // ending, or the grace for its own layout); after that it holds none it cannot use.
  wait.holds_idle_workers = ending || lease_left || !grace_over;
  return wait;
}

RetryPlan Scheduler::PlanRetry(const absl::Status& error, int attempts,
                               const std::vector<std::string>& idle_of_kind) const {
  if (!IsUnreachable(error)) return RankRefused{};
  if (!idle_of_kind.empty() && attempts < policy_.assign_attempts) {
    return RetryOnWorker{idle_of_kind.front()};
  }
  return NoWorkerForRank{};
}

}  // namespace pipetrain::coordinator
