// Scheduling carried out: the scheduler's decisions (scheduler.h: queued jobs in submission
// order with backfill, recovering jobs first, an assignment's retry) applied to the jobs'
// records and the worker registry; generations started and ranks assigned off the lock.
// See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/scheduler.h"

namespace pipetrain::coordinator {
namespace {

// `text` with every run of digits as '#': "needs 8 workers, 3 idle" -> "needs # workers, # idle".
std::string WithoutCounts(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) {
      if (out.empty() || out.back() != '#') out.push_back('#');
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

}  // namespace

void Coordinator::RunGeneration(JobEntry& e, const std::vector<std::string>& placed_workers,
                                v1::JobSpec run_spec, int64_t start_step) {
  const int ranks = static_cast<int>(placed_workers.size());
  std::vector<std::string> rank_workers = placed_workers;
  if (e.held_state && e.held_state->step == start_step &&
      e.held_state->stages == e.job.stages()) {
    // The survivors run their own stages again where they can (within their hosts): the
    // state they hold is then theirs already.
    const SurvivorHold& held = *e.held_state;
    std::map<std::string, std::string> hosts;
    for (const std::string& id : placed_workers) {
      const WorkerPool::Worker* w = pool_.Find(id);
      hosts[id] = w == nullptr ? std::string() : w->info.host();
    }
    rank_workers = KeepStagesOnTheirHolders(
        placed_workers, e.job.stages(),
        [&held](const std::string& id) {
          auto it = held.worker_stages.find(id);
          return it == held.worker_stages.end() ? -1 : it->second;
        },
        [&hosts](const std::string& id) { return hosts.at(id); });
  }
  ApplyEvent(e, GenerationStarted{ranks});
  e.run_spec = std::move(run_spec);
  rendezvous_.Open(e.job.id());
  e.job.clear_message();  // it no longer waits
  e.requeued_because.clear();
  if (e.job.started_unix_ms() == 0) e.job.set_started_unix_ms(NowMs());
  e.job.clear_stage_status();
  e.rank_worker = rank_workers;
  e.ledger = StepLedger(ranks, e.job.stages(), start_step, e.job.step(), e.tokens_per_step);
  e.assign_attempts.assign(ranks, 0);
  commands_.Forget(e.job.id());
  e.restart_point.Reset();
  // The step commit, so that a fault costs no step, where the survivors could go on: with
  // replicas, restarts left, and a schedule and device the commit runs under.
  job::JobConfig layout = e.config;
  layout.stages = e.job.stages();
  layout.replicas = e.job.replicas();
  e.commit_steps = e.job.replicas() > 1 && e.job.restarts() < e.config.max_restarts &&
                   job::CommitStepsRefusal(layout).empty();
  if (e.survivors && e.survivors->plan() && e.survivors->plan()->step != start_step) {
    // Their plan was announced; say that it was not carried out, and where the job goes on.
    jobs_.Event(e.job.id(),
                absl::StrCat("the survivors did not go on from step ", e.survivors->plan()->step,
                             " (their state was not committed): generation ",
                             e.job.generation(), " starts at step ", start_step));
  }
  e.survivors.reset();
  e.replica_state = ReplicaStateFor(e, start_step);
  if (e.replica_state.layers_size() > 0) {
    std::set<std::string> holders;
    for (const auto& layer : e.replica_state.layers()) {
      holders.insert(layer.addresses().begin(), layer.addresses().end());
    }
    jobs_.Event(e.job.id(), absl::StrCat("the ranks take the survivors' state at step ",
                                         start_step, " from the ", holders.size(),
                                         " workers holding it (no checkpoint read)"));
  }
  std::vector<std::string> placed;
  for (int r = 0; r < ranks; ++r) {
    pool_.Assign(*pool_.Find(rank_workers[r]), e.job.id(), r, e.job.generation());
    v1::StageStatus* st = e.job.add_stage_status();
    st->set_stage(r % e.job.stages());
    st->set_replica(r / e.job.stages());
    st->set_worker_id(rank_workers[r]);
    st->set_step(std::max<int64_t>(-1, start_step - 1));
    st->set_state(v1::STAGE_STATE_ASSIGNED);
    // The event names the first kRanksNamed ranks' workers (one of thousands would be a
    // line of hundreds of kilobytes); `pipetrain status` has every rank's.
    if (r < kRanksNamed) placed.push_back(absl::StrCat(RankName(e.job, r), " on ", rank_workers[r]));
    AssignRank(e.job.id(), r);
  }
  const std::string more =
      ranks > kRanksNamed
          ? absl::StrCat(" and ", ranks - kRanksNamed, " more ranks (`pipetrain status ",
                         e.job.id(), "` lists every one)")
          : "";
  jobs_.Event(e.job.id(), absl::StrCat(e.job.generation() > 1 ? absl::StrCat("generation ", e.job.generation(), " ")
                                                  : std::string(),
                                 "running: ", absl::StrJoin(placed, ", "), more));
  jobs_.Changed(e);
}

bool Coordinator::PlaceRecovering() {
  bool waiting = false;
  const std::vector<JobEntry*> recovering =
      jobs_.InOrder([](const JobEntry& e) { return e.run.phase == Phase::kRecovering; });
  const absl::Time now = deps_.clock->Now();
  for (JobEntry* e : recovering) {
    std::vector<v1::WorkerInfo> workers = pool_.Infos();
    if (e->held_state && e->held_state->step == e->job.checkpoint_step()) {
      // The survivors first, each stage's in turn (a smaller layout then keeps as many
      // holders of each stage as it can: RunGeneration puts them on their stages).
      const std::map<std::string, int> turn = e->held_state->HolderTurns();
      std::stable_sort(workers.begin(), workers.end(),
                       [&turn](const v1::WorkerInfo& a, const v1::WorkerInfo& b) {
                         auto ta = turn.find(a.id()), tb = turn.find(b.id());
                         const int ka = ta == turn.end() ? INT_MAX : ta->second;
                         const int kb = tb == turn.end() ? INT_MAX : tb->second;
                         return ka < kb;
                       });
    }
    const RecoveryPlan plan =
        scheduler_.PlanRecovery({&e->job, &e->config, e->recovering_since, e->lost_ranks_stop_by},
                                workers, now);
    if (const auto* give_up = std::get_if<GiveUp>(&plan)) {
      ApplyEvent(*e, RecoveryTimedOut{give_up->message});
      continue;
    }
    if (const auto* wait = std::get_if<WaitForWorkers>(&plan)) {
      // Why it waits, in `status` (and, when it starts waiting, its events).
      if (e->job.message() != wait->why) {
        if (!absl::StrContains(e->job.message(), "; waits for workers to restart on: ")) {
          jobs_.Event(e->job.id(), wait->why);
        }
        e->job.set_message(wait->why);
        jobs_.Changed(*e);
      }
      if (wait->holds_idle_workers) waiting = true;
      continue;
    }
    const StartGeneration& start = std::get<StartGeneration>(plan);
    e->job.set_stages(start.layout.stages);
    e->job.set_replicas(start.layout.replicas);
    v1::Recovery* rec = e->job.mutable_recoveries(e->job.recoveries_size() - 1);
    rec->set_stages(start.layout.stages);
    rec->set_replicas(start.layout.replicas);
    rec->set_microbatches(start.layout.micro_batches);
    rec->set_placed_unix_ms(NowMs());
    if (!start.announcement.empty()) jobs_.Event(e->job.id(), start.announcement);
    RunGeneration(*e, start.rank_workers, start.run_spec, start.start_step);
  }
  return waiting;
}

void Coordinator::Schedule() {
  // A job recovering from a fault has the idle workers first; queued jobs wait while it is
  // about to take them (PlaceRecovering).
  if (PlaceRecovering()) return;
  const std::vector<JobEntry*> queued = jobs_.InOrder(
      [](const JobEntry& e) { return e.job.state() == v1::JOB_STATE_QUEUED && e.durable; });
  if (queued.empty()) return;  // (the registry's view is not copied for nothing)
  std::vector<QueuedJob> wanted;
  for (const JobEntry* e : queued) {
    wanted.push_back({e->job.id(), e->job.stages() * e->job.replicas(),
                      e->config.threads_per_stage, e->config.device,
                      scheduler_.PlacerFor(e->config)});
  }
  const PlacementPlan plan = scheduler_.PlanQueue(wanted, pool_.Placeable());
  for (const Waiting& waiting : plan.waiting) {
    JobEntry& e = jobs_.at(waiting.job_id);
    const std::string reason = e.requeued_because.empty()
                                   ? waiting.reason
                                   : absl::StrCat(e.requeued_because, "; ", waiting.reason);
    if (e.job.message() == reason) continue;
    // Why it waits, in `status` and (when it changes) in its events; the same reason with
    // other counts (workers registering one by one, thousands of them) only in `status`,
    // written with progress (at most once a second).
    const bool counts_only = WithoutCounts(e.job.message()) == WithoutCounts(reason);
    e.job.set_message(reason);
    if (!counts_only) jobs_.Event(waiting.job_id, absl::StrCat("queued: ", waiting.reason));
    jobs_.Changed(e, /*progress_only=*/counts_only);
  }
  for (const Placement& p : plan.started) {
    JobEntry& e = jobs_.at(p.job_id);
    RunGeneration(e, p.rank_workers, e.job.spec(), e.job.spec().has_resume_from() ? -1 : 0);
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
  assignment.set_commit_steps(e.commit_steps);
  assignment.set_skipped_in_a_row(SkippedInARowBefore(e.skipped_steps, e.ledger.start_step()));
  if (e.replica_state.layers_size() > 0) *assignment.mutable_replica_state() = e.replica_state;
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
  const bool unreachable = IsUnreachable(error);
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
  const RetryPlan plan = scheduler_.PlanRetry(error, ++e.assign_attempts[rank], idle);
  if (const auto* retry = std::get_if<RetryOnWorker>(&plan)) {
    pool_.Assign(*pool_.Find(retry->worker_id), job_id, rank, e.job.generation());
    e.rank_worker[rank] = retry->worker_id;
    e.job.mutable_stage_status(rank)->set_worker_id(retry->worker_id);
    jobs_.Event(job_id, absl::StrCat(failed, "; assigned to ", retry->worker_id, " instead"));
    jobs_.Changed(e);
    AssignRank(job_id, rank);
    return;
  }
  if (std::holds_alternative<NoWorkerForRank>(plan)) {
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
