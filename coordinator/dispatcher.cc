// Where jobs run, carried out. See dispatcher.h.
#include "coordinator/dispatcher.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <variant>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler.h"

namespace pipetrain::coordinator {

Dispatcher::Dispatcher(CoordinatorState& state)
    : state_(state),
      scheduler_(SchedulerPolicy{state.options.heartbeat_interval, state.options.assign_attempts,
                                 state.options.host_policy, state.options.host_links}) {}

void Dispatcher::Tick() {
  state_.mu.AssertHeld();
  // A held-back rank failure becomes the job's once every worker of a rank still running
  // has heartbeated more than half an interval after it (so that a heartbeat sent before
  // a peer died, still on its way, does not count); a lost one ended the job above.
  for (auto& [id, e] : state_.jobs) {
    const JobRun& run = e.controller.run();
    if (run.phase != Phase::kHeldFailure) continue;
    const std::vector<std::string>& rank_worker = e.controller.rank_worker();
    bool alive = true;
    for (size_t r = 0; r < rank_worker.size() && r < run.rank_ended.size(); ++r) {
      const WorkerPool::Worker* w = state_.pool.Find(rank_worker[r]);
      if (!run.rank_ended[r] && w != nullptr &&
          w->last_heartbeat <= run.held_since + state_.options.heartbeat_interval / 2) {
        alive = false;
      }
    }
    if (alive) {
      e.controller.Apply(PeersAlive{});
      state_.Carry(e);
    }
  }
  // Survivors' rounds past their deadline decide without the ranks that did not report.
  for (auto& [id, e] : state_.jobs) {
    e.controller.Tick();
    state_.Carry(e);
  }
  Schedule();
}

void Dispatcher::Schedule() {
  state_.mu.AssertHeld();
  // A job recovering from a fault has the idle workers first; queued jobs wait while it is
  // about to take them (PlaceRecovering).
  if (PlaceRecovering()) return;
  const std::vector<JobEntry*> queued = state_.jobs.InOrder([](const JobEntry& e) {
    return e.controller.job().state() == v1::JOB_STATE_QUEUED && e.durable;
  });
  if (queued.empty()) return;  // (the registry's view is not copied for nothing)
  std::vector<QueuedJob> wanted;
  for (const JobEntry* e : queued) {
    const JobController& c = e->controller;
    wanted.push_back({c.id(), c.job().stages() * c.job().replicas(), c.config().threads_per_stage(),
                      c.config().device(), scheduler_.PlacerFor(c.config())});
  }
  const PlacementPlan plan = scheduler_.PlanQueue(wanted, state_.pool.Placeable());
  for (const Waiting& waiting : plan.waiting) {
    JobEntry& e = state_.jobs.at(waiting.job_id);
    e.controller.WaitsInQueue(waiting.reason);
    state_.Carry(e);
  }
  for (const Placement& p : plan.started) {
    JobEntry& e = state_.jobs.at(p.job_id);
    const v1::JobSpec& spec = e.controller.job().spec();
    e.controller.StartGeneration(p.rank_workers, WorkerHosts(), spec,
                                 spec.has_resume_from() ? -1 : 0, LiveWorkerAddresses());
    AssignGeneration(e);
  }
}

bool Dispatcher::PlaceRecovering() {
  bool waiting = false;
  const std::vector<JobEntry*> recovering = state_.jobs.InOrder(
      [](const JobEntry& e) { return e.controller.phase() == Phase::kRecovering; });
  const absl::Time now = state_.clock->Now();
  for (JobEntry* e : recovering) {
    JobController& c = e->controller;
    std::vector<v1::WorkerInfo> workers = state_.pool.Infos();
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
      state_.Carry(*e);
      continue;
    }
    if (const auto* wait = std::get_if<WaitForWorkers>(&plan)) {
      c.WaitsToRecover(wait->why);
      state_.Carry(*e);
      if (wait->holds_idle_workers) waiting = true;
      continue;
    }
    c.Recover(std::get<StartGeneration>(plan), WorkerHosts(), LiveWorkerAddresses());
    AssignGeneration(*e);
  }
  return waiting;
}

void Dispatcher::AssignGeneration(JobEntry& e) {
  state_.Carry(e);
  const JobController& c = e.controller;
  for (int r = 0; r < static_cast<int>(c.rank_worker().size()); ++r) {
    state_.pool.Assign(*state_.pool.Find(c.rank_worker()[r]), c.id(), r, c.job().generation());
    AssignRank(c.id(), r);
  }
}

void Dispatcher::AssignRank(const std::string& job_id, int rank) {
  const JobController& c = state_.jobs.at(job_id).controller;
  const std::string worker_id = c.rank_worker()[rank];
  std::shared_ptr<WorkerClient> client = state_.pool.Find(worker_id)->client;
  v1::StageAssignment assignment = c.AssignmentFor(rank);
  state_.Later([this, client, assignment, worker_id] {
    absl::Status s = client->AssignStage(assignment);
    if (s.ok()) return;
    StateLock lock(&state_);
    auto it = state_.jobs.find(assignment.job_id());
    if (it == state_.jobs.end() ||
        it->second.controller.job().generation() != assignment.generation()) {
      return;
    }
    AssignmentFailed(assignment.job_id(), assignment.rank(), worker_id, s);
  });
}

void Dispatcher::AssignmentFailed(const std::string& job_id, int rank, const std::string& worker_id,
                                  const absl::Status& error) {
  auto it = state_.jobs.find(job_id);
  if (it == state_.jobs.end()) return;
  JobEntry& e = it->second;
  JobController& c = e.controller;
  // Only the running generation's (one that ended, or a job that ended, is not touched).
  if (c.phase() != Phase::kRunning && c.phase() != Phase::kHeldFailure) return;
  if (c.rank_worker()[rank] != worker_id) return;  // moved already
  const std::string failed = absl::StrCat("assigning ", RankName(c.job(), rank), " to ", worker_id,
                                          " failed: ", error.message());
  WorkerPool::Worker* w = state_.pool.Find(worker_id);
  const bool unreachable = IsUnreachable(error);
  if (w != nullptr) {
    state_.pool.Release(*w);  // its rank is moved below, or the job fails: not the listener's
    // Not chosen again until it registers again.
    if (unreachable) state_.pool.MarkLost(*w, state_.clock->Now(), failed);
  }
  std::vector<std::string> idle;  // of the job's device kind
  for (const std::string& id : state_.pool.IdleIds()) {
    if (DeviceKind(state_.pool.Find(id)->info.device()) == DeviceKind(c.config().device())) {
      idle.push_back(id);
    }
  }
  const RetryPlan plan = scheduler_.PlanRetry(error, c.AssignmentAttempt(rank), idle);
  if (const auto* retry = std::get_if<RetryOnWorker>(&plan)) {
    state_.pool.Assign(*state_.pool.Find(retry->worker_id), job_id, rank, c.job().generation());
    c.MoveRank(rank, retry->worker_id, failed);
    state_.Carry(e);
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
  state_.Carry(e);
  Schedule();
}

std::function<std::string(const std::string&)> Dispatcher::WorkerHosts() {
  return [this](const std::string& id) {
    state_.mu.AssertHeld();
    const WorkerPool::Worker* w = state_.pool.Find(id);
    return w == nullptr ? std::string() : w->info.host();
  };
}

std::function<std::string(const std::string&)> Dispatcher::LiveWorkerAddresses() {
  return [this](const std::string& id) {
    state_.mu.AssertHeld();
    const WorkerPool::Worker* w = state_.pool.Find(id);
    return w != nullptr && w->info.state() != v1::WORKER_STATE_LOST ? w->info.address()
                                                                    : std::string();
  };
}

}  // namespace pipetrain::coordinator
