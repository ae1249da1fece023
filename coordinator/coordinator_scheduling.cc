// Scheduling carried out: the scheduler's decisions (scheduler.h: queued jobs in submission
// order with backfill, recovering jobs first, an assignment's retry) handed to the jobs'
// controllers and applied to the worker registry; ranks assigned off the lock.
// See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <variant>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler.h"

namespace pipetrain::coordinator {

std::function<std::string(const std::string&)> Coordinator::WorkerHosts() {
  return [this](const std::string& id) {
    mu_.AssertHeld();
    const WorkerPool::Worker* w = pool_.Find(id);
    return w == nullptr ? std::string() : w->info.host();
  };
}

std::function<std::string(const std::string&)> Coordinator::LiveWorkerAddresses() {
  return [this](const std::string& id) {
    mu_.AssertHeld();
    const WorkerPool::Worker* w = pool_.Find(id);
    return w != nullptr && w->info.state() != v1::WORKER_STATE_LOST ? w->info.address()
                                                                      : std::string();
  };
}

void Coordinator::AssignGeneration(JobEntry& e) {
  Carry(e);
  const JobController& c = e.controller;
  for (int r = 0; r < static_cast<int>(c.rank_worker().size()); ++r) {
    pool_.Assign(*pool_.Find(c.rank_worker()[r]), c.id(), r, c.job().generation());
    AssignRank(c.id(), r);
  }
}

bool Coordinator::PlaceRecovering() {
  bool waiting = false;
  const std::vector<JobEntry*> recovering = jobs_.InOrder(
      [](const JobEntry& e) { return e.controller.phase() == Phase::kRecovering; });
  const absl::Time now = deps_.clock->Now();
  for (JobEntry* e : recovering) {
    JobController& c = e->controller;
    std::vector<v1::WorkerInfo> workers = pool_.Infos();
    if (c.held_state() && c.held_state()->step == c.job().checkpoint_step()) {
      // The survivors first, each stage's in turn (a smaller layout then keeps as many
      // holders of each stage as it can: StartGeneration puts them on their stages).
      const std::map<std::string, int> turn = c.held_state()->HolderTurns();
      std::stable_sort(workers.begin(), workers.end(),
                       [&turn](const v1::WorkerInfo& a, const v1::WorkerInfo& b) {
                         auto ta = turn.find(a.id()), tb = turn.find(b.id());
                         const int ka = ta == turn.end() ? INT_MAX : ta->second;
                         const int kb = tb == turn.end() ? INT_MAX : tb->second;
                         return ka < kb;
                       });
    }
    const RecoveryPlan plan = scheduler_.PlanRecovery(
        {&c.job(), &c.config(), c.recovering_since(), c.lost_ranks_stop_by()}, workers, now);
    if (const auto* give_up = std::get_if<GiveUp>(&plan)) {
      c.Apply(RecoveryTimedOut{give_up->message});
      Carry(*e);
      continue;
    }
    if (const auto* wait = std::get_if<WaitForWorkers>(&plan)) {
      c.WaitsToRecover(wait->why);
      Carry(*e);
      if (wait->holds_idle_workers) waiting = true;
      continue;
    }
    c.Recover(std::get<StartGeneration>(plan), WorkerHosts(), LiveWorkerAddresses());
    AssignGeneration(*e);
  }
  return waiting;
}

void Coordinator::Schedule() {
  // A job recovering from a fault has the idle workers first; queued jobs wait while it is
  // about to take them (PlaceRecovering).
  if (PlaceRecovering()) return;
  const std::vector<JobEntry*> queued = jobs_.InOrder([](const JobEntry& e) {
    return e.controller.job().state() == v1::JOB_STATE_QUEUED && e.durable;
  });
  if (queued.empty()) return;  // (the registry's view is not copied for nothing)
  std::vector<QueuedJob> wanted;
  for (const JobEntry* e : queued) {
    const JobController& c = e->controller;
    wanted.push_back({c.id(), c.job().stages() * c.job().replicas(),
                      c.config().threads_per_stage, c.config().device,
                      scheduler_.PlacerFor(c.config())});
  }
  const PlacementPlan plan = scheduler_.PlanQueue(wanted, pool_.Placeable());
  for (const Waiting& waiting : plan.waiting) {
    JobEntry& e = jobs_.at(waiting.job_id);
    e.controller.WaitsInQueue(waiting.reason);
    Carry(e);
  }
  for (const Placement& p : plan.started) {
    JobEntry& e = jobs_.at(p.job_id);
    const v1::JobSpec& spec = e.controller.job().spec();
    e.controller.StartGeneration(p.rank_workers, WorkerHosts(), spec, spec.has_resume_from() ? -1 : 0,
                                 LiveWorkerAddresses());
    AssignGeneration(e);
  }
}

void Coordinator::AssignRank(const std::string& job_id, int rank) {
  const JobController& c = jobs_.at(job_id).controller;
  const std::string worker_id = c.rank_worker()[rank];
  std::shared_ptr<WorkerClient> client = pool_.Find(worker_id)->client;
  v1::StageAssignment assignment = c.AssignmentFor(rank);
  Later([this, client, assignment, worker_id] {
    absl::Status s = client->AssignStage(assignment);
    if (s.ok()) return;
    LockedThenFlush([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = jobs_.find(assignment.job_id());
      if (it == jobs_.end() || it->second.controller.job().generation() != assignment.generation()) {
        return 0;
      }
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
  JobController& c = e.controller;
  // Only the running generation's (one that ended, or a job that ended, is not touched).
  if (c.phase() != Phase::kRunning && c.phase() != Phase::kHeldFailure) return;
  if (c.rank_worker()[rank] != worker_id) return;  // moved already
  const std::string failed = absl::StrCat("assigning ", RankName(c.job(), rank), " to ", worker_id,
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
    if (DeviceKind(pool_.Find(id)->info.device()) == DeviceKind(c.config().device)) {
      idle.push_back(id);
    }
  }
  const RetryPlan plan = scheduler_.PlanRetry(error, c.AssignmentAttempt(rank), idle);
  if (const auto* retry = std::get_if<RetryOnWorker>(&plan)) {
    pool_.Assign(*pool_.Find(retry->worker_id), job_id, rank, c.job().generation());
    c.MoveRank(rank, retry->worker_id, failed);
    Carry(e);
    AssignRank(job_id, rank);
    return;
  }
  if (std::holds_alternative<NoWorkerForRank>(plan)) {
    // No worker to take the rank: a placement failure, not the job's. It waits in the queue
    // for workers, as a job that never started would (the unreachable one is lost until it
    // registers again), and costs no restart.
    c.Apply(Unplaceable{rank, failed});
  } else {
    c.Apply(Fault{failed, rank});
  }
  Carry(e);
  Schedule();
}

}  // namespace pipetrain::coordinator
