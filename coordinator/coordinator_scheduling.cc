// Scheduling: queued jobs placed in submission order with backfill (placement.h), recovering
// jobs placed first on the idle workers (the same layout after a grace, else the best
// smaller one whose ranks fit the workers' memory), generations started, ranks assigned
// off the lock and an assignment that fails moved to another idle worker or handed to the
// job machine. See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/placement.h"
#include "jobspec/job_config_from_spec.h"
#include "jobspec/step_commands.h"
#include "proto/states.h"
#include "runtime/base/status_macros.h"
#include "runtime/model/model_config.h"
#include "runtime/model/partition.h"
#include "runtime/planner/predict.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::coordinator {

namespace {

// What one rank of `layout` holds for its parameters, for the largest stage, as the
// planner's memory model counts it (planner::WeightBytes: each parameter in its weight
// versions and the optimizer's state) plus its gradient, at the job's dtype. Activations are
// not counted (they need the model's profile). nullopt where it
// is not known without building the model (TorchScript).
std::optional<int64_t> RankParameterStateBytes(const job::JobConfig& c,
                                               const model::PipelineLayout& layout) {
  model::ModelConfig m = c.model;
  const std::string kind = job::EffectiveDataKind(c);
  if (kind != "classification") {
    m.vocab_size = c.data.vocab > 0 ? c.data.vocab : (kind == "bytes" ? 256 : 65536);
    m.seq_len = c.data.seq_len;
  }
  absl::StatusOr<std::vector<model::LayerInfo>> layers = model::BuiltinLayers(m);
  if (!layers.ok()) return std::nullopt;
  std::vector<double> counts;
  for (const model::LayerInfo& l : *layers) counts.push_back(static_cast<double>(l.num_parameters));
  // The layout's own layers, else balanced as the job will be.
  std::vector<model::LayerRange> ranges;
  for (const auto& [begin, end] : layout.stage_layers) ranges.push_back({begin, end});
  if (ranges.empty()) {
    absl::StatusOr<std::vector<model::LayerRange>> balanced =
        model::BalancedPartition(counts, layout.stages);
    if (!balanced.ok()) return std::nullopt;
    ranges = *std::move(balanced);
  }
  double largest = 0;
  for (const model::LayerRange& r : ranges) {
    double sum = 0;
    for (int i = r.begin; i < r.end && i < static_cast<int>(counts.size()); ++i) sum += counts[i];
    largest = std::max(largest, sum);
  }
  const int element = c.precision == job::Precision::kFloat64 ? 8 : 4;  // bf16 keeps fp32 weights
  const int64_t parameter_bytes = static_cast<int64_t>(largest) * element;
  // The planner's model of a stage's weights, and its gradient.
  return planner::WeightBytes(c.schedule, parameter_bytes,
                              weights::OptimizerStateCopies(c.optimizer) * parameter_bytes) +
         parameter_bytes;
}

}  // namespace

void Coordinator::StartGeneration(JobEntry& e, const std::vector<std::string>& rank_workers,
                                  v1::JobSpec run_spec, int64_t start_step) {
  const int ranks = static_cast<int>(rank_workers.size());
  ApplyEvent(e, GenerationStarted{ranks});
  e.run_spec = std::move(run_spec);
  e.store = rendezvous::MakeMemoryStore({kKvValueBytes, kKvJobBytes});
  e.job.clear_message();  // it no longer waits
  e.requeued_because.clear();
  if (e.job.started_unix_ms() == 0) e.job.set_started_unix_ms(NowMs());
  e.job.clear_stage_status();
  e.rank_worker = rank_workers;
  e.ledger = StepLedger(ranks, e.job.stages(), start_step, e.job.step(), e.tokens_per_step);
  e.assign_attempts.assign(ranks, 0);
  e.command_reports.clear();
  e.reported_checkpoint = {0, ""};
  e.draining_worker.clear();
  e.drain_step = 0;
  std::vector<std::string> placed;
  for (int r = 0; r < ranks; ++r) {
    pool_.Assign(*pool_.Find(rank_workers[r]), e.job.id(), r, e.job.generation());
    v1::StageStatus* st = e.job.add_stage_status();
    st->set_stage(r % e.job.stages());
    st->set_replica(r / e.job.stages());
    st->set_worker_id(rank_workers[r]);
    st->set_step(std::max<int64_t>(-1, start_step - 1));
    st->set_state(v1::STAGE_STATE_ASSIGNED);
    placed.push_back(absl::StrCat(RankName(e.job, r), " on ", rank_workers[r]));
    AssignRank(e.job.id(), r);
  }
  Event(e.job.id(), absl::StrCat(e.job.generation() > 1 ? absl::StrCat("generation ", e.job.generation(), " ")
                                                  : std::string(),
                                 "running: ", absl::StrJoin(placed, ", ")));
  Changed(e);
}

bool Coordinator::PlaceRecovering() {
  bool waiting = false;
  std::vector<JobEntry*> recovering;
  for (auto& [id, e] : jobs_) {
    if (e.run.phase == Phase::kRecovering) recovering.push_back(&e);
  }
  std::sort(recovering.begin(), recovering.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  const absl::Time now = deps_.clock->Now();
  for (JobEntry* e : recovering) {
    // Every rank of the last generation has ended (its worker reported it, or was lost).
    bool ending = false;
    for (const v1::WorkerInfo& w : pool_.Infos()) {
      if ((w.state() == v1::WORKER_STATE_BUSY || w.state() == v1::WORKER_STATE_DRAINING) &&
          w.job_id() == e->job.id()) {
        ending = true;
      }
    }
    const int min_cores = e->config.threads_per_stage;
    std::vector<std::string> idle;
    for (const v1::WorkerInfo& w : pool_.Infos()) {
      if (w.state() == v1::WORKER_STATE_IDLE && DeviceKind(w.device()) == DeviceKind(e->config.device) &&
          (min_cores <= 0 || w.cores() <= 0 || w.cores() >= min_cores)) {
        idle.push_back(w.id());
      }
    }
    const v1::JobSpec& spec = e->job.spec();
    const job::JobConfig& c = e->config;
    const model::PipelineLayout original = job::PipelineLayoutOf(c);
    const bool full = static_cast<int>(idle.size()) >= original.ranks();
    const bool grace_over = now - e->recovering_since >= 3 * options_.heartbeat_interval;
    std::optional<std::pair<model::PipelineLayout, v1::JobSpec>> chosen;
    std::vector<std::string> chosen_workers;
    std::string too_small;  // why layouts were passed over, for the job's message
    if (!ending && (full || grace_over)) {
      for (const model::PipelineLayout& l : RecoveryLayouts(
               original, static_cast<int>(idle.size()), spec.stage_ranges_size() > 0)) {
        // Only workers whose memory holds a rank's parameter state (when both are known).
        const std::optional<int64_t> need = RankParameterStateBytes(c, l);
        std::vector<std::string> fit;
        for (const std::string& id : idle) {
          const int64_t memory = pool_.Find(id)->info.memory_bytes();
          if (!need || memory <= 0 || memory >= *need) fit.push_back(id);
        }
        if (static_cast<int>(fit.size()) < l.ranks()) {
          too_small = absl::StrCat("; ", l.stages, " stages x ", l.replicas, " replicas need ",
                                   l.ranks(), " workers with ", need.value_or(0),
                                   " bytes for a rank's parameters, gradients and optimizer "
                                   "state, ", fit.size(), " idle have them");
          continue;
        }
        v1::JobSpec run = spec;
        if (l.stages != original.stages) {
          run.clear_stage_ranges();
          run.set_stages(l.stages);
        }
        run.set_replicas(l.replicas);
        run.set_microbatches(l.micro_batches);
        if (e->job.checkpoint_step() > 0) run.set_resume_from(e->job.checkpoint_path());
        if (jobspec::JobConfigFromSpec(run).ok()) {
          chosen.emplace(l, std::move(run));
          chosen_workers = fit;
          break;
        }
      }
    }
    if (!chosen) {
      const absl::Duration limit = absl::Seconds(c.recv_timeout_s);
      if (now - e->recovering_since > limit) {
        ApplyEvent(*e, RecoveryTimedOut{
               absl::StrCat("no workers to restart on within timeout_s (",
                            absl::FormatDuration(limit), "): ", idle.size(), " idle",
                            ending ? ", ranks of the last generation still ending" : "",
                            too_small,
                            "; it ran ", e->job.step() + 1, " of ", e->job.steps(),
                            " steps; the last fault: ", e->job.recoveries().empty()
                                ? std::string("?")
                                : e->job.recoveries(e->job.recoveries_size() - 1).cause())});
        continue;
      }
      // Why it waits, in `status` (and, when it changes, its events).
      const std::string why = absl::StrCat(
          "recovering (restart ", e->job.restarts(), " of ", c.max_restarts, "): ",
          e->job.recoveries().empty()
              ? std::string("?")
              : e->job.recoveries(e->job.recoveries_size() - 1).cause(),
          "; waits for workers to restart on: ", idle.size(), " idle",
          ending ? ", ranks of the last generation still ending" : "",
          !grace_over && !ending ? ", the same layout for 3 heartbeats" : "", too_small,
          "; up to timeout_s (", absl::FormatDuration(limit), ") in all");
      if (e->job.message() != why) {
        // An event when it starts waiting; `status` follows every change of the counts.
        if (!absl::StrContains(e->job.message(), "; waits for workers to restart on: ")) {
          Event(e->job.id(), why);
        }
        e->job.set_message(why);
        Changed(*e);
      }
      // The idle workers are kept for it only while it is about to take them (its old ranks
      // ending, or the grace for its own layout); after that it holds none it cannot use,
      // and queued jobs start on them.
      if (ending || !grace_over) waiting = true;
      continue;
    }
    const auto& [layout, run] = *chosen;
    e->job.set_stages(layout.stages);
    e->job.set_replicas(layout.replicas);
    v1::Recovery* rec = e->job.mutable_recoveries(e->job.recoveries_size() - 1);
    rec->set_stages(layout.stages);
    rec->set_replicas(layout.replicas);
    rec->set_microbatches(layout.micro_batches);
    rec->set_placed_unix_ms(NowMs());
    if (layout.stages != original.stages || layout.replicas != original.replicas) {
      Event(e->job.id(), absl::StrCat("only ", idle.size(), " workers: generation ",
                                      e->job.generation() + 1, " runs ", layout.stages, " stages x ",
                                      layout.replicas, " replicas x ", layout.micro_batches,
                                      " micro-batches (the global batch unchanged)"));
    }
    const int ranks = layout.ranks();
    StartGeneration(*e, std::vector<std::string>(chosen_workers.begin(),
                                                 chosen_workers.begin() + ranks), run,
                    e->job.checkpoint_step() > 0 ? e->job.checkpoint_step()
                                                 : (run.has_resume_from() ? -1 : 0));
  }
  return waiting;
}

void Coordinator::Schedule() {
  // A job recovering from a fault has the idle workers first; queued jobs wait while it is
  // about to take them (PlaceRecovering).
  if (PlaceRecovering()) return;
  std::vector<JobEntry*> queued;
  for (auto& [id, e] : jobs_) {
    if (e.job.state() == v1::JOB_STATE_QUEUED && e.durable) queued.push_back(&e);
  }
  std::sort(queued.begin(), queued.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  std::vector<QueuedJob> wanted;
  for (const JobEntry* e : queued) {
    wanted.push_back({e->job.id(), e->job.stages() * e->job.replicas(),
                      e->config.threads_per_stage, e->config.device});
  }
  std::vector<PoolWorker> pool;
  for (const v1::WorkerInfo& w : pool_.Infos()) {
    if (w.state() != v1::WORKER_STATE_LOST) {
      pool.push_back({w.id(), w.cores(), w.state() == v1::WORKER_STATE_IDLE, w.device()});
    }
  }
  const PlacementPlan plan = PlaceQueuedJobs(wanted, pool);
  for (const Waiting& waiting : plan.waiting) {
    JobEntry& e = jobs_.at(waiting.job_id);
    const std::string reason = e.requeued_because.empty()
                                   ? waiting.reason
                                   : absl::StrCat(e.requeued_because, "; ", waiting.reason);
    if (e.job.message() == reason) continue;
    // Why it waits, in `status` and (when it changes) in its events.
    e.job.set_message(reason);
    Event(waiting.job_id, absl::StrCat("queued: ", waiting.reason));
    Changed(e);
  }
  for (const Placement& p : plan.started) {
    JobEntry& e = jobs_.at(p.job_id);
    StartGeneration(e, p.rank_workers, e.job.spec(), e.job.spec().has_resume_from() ? -1 : 0);
  }
}

void Coordinator::AssignRank(const std::string& job_id, int rank) {
  const JobEntry& e = jobs_.at(job_id);
  const std::string worker_id = e.rank_worker[rank];
  std::shared_ptr<WorkerClient> client = pool_.Find(worker_id)->client;
  v1::StageAssignment assignment;
  assignment.set_job_id(job_id);
  *assignment.mutable_spec() = e.run_spec;
  assignment.set_rank(rank);
  assignment.set_generation(e.job.generation());
  Later([this, client, assignment, worker_id] {
    absl::Status s = client->AssignStage(assignment);
    if (s.ok()) return;
    LockedThenFlush([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = jobs_.find(assignment.job_id());
      if (it == jobs_.end() || it->second.job.generation() != assignment.generation()) return 0;
      AssignmentFailed(assignment.job_id(), assignment.rank(), worker_id, s);
      return 0;
    });
  });
}

void Coordinator::AssignmentFailed(const std::string& job_id, int rank,
                                   const std::string& worker_id, const absl::Status& error) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  JobEntry& e = it->second;
  // Only the running generation's (one that ended, or a job that ended, is not touched).
  if (e.run.phase != Phase::kRunning && e.run.phase != Phase::kHeldFailure) return;
  if (e.rank_worker[rank] != worker_id) return;  // moved already
  const std::string failed = absl::StrCat("assigning ", RankName(e.job, rank), " to ", worker_id,
                                          " failed: ", error.message());
  WorkerPool::Worker* w = pool_.Find(worker_id);
  const bool unreachable = absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error);
  if (w != nullptr) {
    pool_.Release(*w);  // its rank is moved below, or the job fails: not the listener's
    // Not chosen again until it registers again.
    if (unreachable) pool_.MarkLost(*w, deps_.clock->Now(), failed);
  }
  std::vector<std::string> idle;  // of the job's device kind
  for (const std::string& id : pool_.IdleIds()) {
    if (DeviceKind(pool_.Find(id)->info.device()) == DeviceKind(e.config.device)) {
      idle.push_back(id);
    }
  }
  if (unreachable && !idle.empty() && ++e.assign_attempts[rank] < options_.assign_attempts) {
    const std::string next = idle.front();
    pool_.Assign(*pool_.Find(next), job_id, rank, e.job.generation());
    e.rank_worker[rank] = next;
    e.job.mutable_stage_status(rank)->set_worker_id(next);
    Event(job_id, absl::StrCat(failed, "; assigned to ", next, " instead"));
    Changed(e);
    AssignRank(job_id, rank);
    return;
  }
  if (unreachable) {
    // No worker to take the rank: a placement failure, not the job's. It waits in the queue
    // for workers, as a job that never started would (the unreachable one is lost until it
    // registers again), and costs no restart.
    ApplyEvent(e, Unplaceable{rank, failed});
  } else {
    ApplyEvent(e, Fault{failed, rank});
  }
  Schedule();
}

}  // namespace pipetrain::coordinator
