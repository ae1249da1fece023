// The coordinator's wiring: the parts made and the store loaded (Open), the monitor, and the
// metrics snapshot. See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <utility>

#include "proto/states.h"

namespace pipetrain::coordinator {

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = OpenSqliteJobStore(options.db_path);
  if (!store.ok()) return store.status();
  CoordinatorDeps deps;
  deps.store = *std::move(store);
  return Open(options, std::move(deps));
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options,
                                                               CoordinatorDeps deps) {
  if (!deps.store) return absl::InvalidArgumentError("a coordinator needs a job store");
  if (!deps.clock) deps.clock = std::make_shared<RealClock>();
  if (!deps.connect) deps.connect = GrpcWorkerConnector(options.security);
  const bool monitor = deps.start_monitor;
  std::unique_ptr<Coordinator> c(new Coordinator(options, std::move(deps)));
  if (absl::Status s = c->jobs_.Load(); !s.ok()) return s;
  if (monitor) {
    c->last_pass_ms_.store(absl::ToUnixMillis(c->deps_.clock->Now()));
    c->monitor_ = std::thread([raw = c.get()] { raw->Monitor(); });
  }
  return c;
}

Coordinator::Coordinator(CoordinatorOptions options, CoordinatorDeps deps)
    : options_(std::move(options)),
      deps_(std::move(deps)),
      state_(options_, deps_.clock, deps_.store.get(),
             [this](std::function<void()> call) {
               if (deps_.run_later) {
                 deps_.run_later(std::move(call));
               } else {
                 calls_.Run(std::move(call));
               }
             }),
      dispatcher_(state_),
      jobs_(state_, dispatcher_),
      workers_(state_, dispatcher_, deps_.connect),
      reports_(state_, dispatcher_) {}

void Coordinator::StopMonitor() {
  {
    absl::MutexLock lock(&state_.mu);
    state_.stopping = true;
  }
  state_.changed.SignalAll();
  if (monitor_.joinable()) monitor_.join();
}

Coordinator::~Coordinator() {
  StopMonitor();
  // calls_, declared last, is destroyed first: it runs what is queued, then joins.
}

void Coordinator::Tick() {
  StateLock lock(&state_);
  workers_.Tick();
  dispatcher_.Tick();
}

void Coordinator::Monitor() {
  absl::MutexLock lock(&state_.mu);
  while (!state_.stopping) {
    // Until the next worker is due to be lost (so that it is lost two intervals after its
    // last heartbeat, not up to a tick later), or a quarter interval at most.
    const absl::Duration wait =
        std::min(std::max(absl::Milliseconds(10), options_.heartbeat_interval / 4),
                 state_.pool.NextExpiry(2 * options_.heartbeat_interval) + absl::Milliseconds(1) -
                     deps_.clock->Now());
    // Woken early only to stop (job changes do not count).
    const absl::Duration asked = std::max(absl::Milliseconds(1), wait);
    const absl::Time due = deps_.clock->Now() + asked;
    if (state_.mu.AwaitWithTimeout(absl::Condition(&state_.stopping), asked)) break;
    // Woken more than half an interval late: this process was stalled, not the workers.
    if (const absl::Duration late = deps_.clock->Now() - due;
        late > options_.heartbeat_interval / 2) {
      workers_.CoordinatorStalled(late);
    }
    workers_.Tick();
    dispatcher_.Tick();
    state_.mu.Unlock();
    (void)state_.FlushWrites();
    last_pass_ms_.store(absl::ToUnixMillis(deps_.clock->Now()));
    state_.mu.Lock();
  }
}

bool Coordinator::StateLoopLive() const {
  if (!monitor_.joinable()) return true;
  const absl::Time last = absl::FromUnixMillis(last_pass_ms_.load());
  return deps_.clock->Now() - last <= options_.stall_limit;
}

Coordinator::MetricsSnapshot Coordinator::Metrics() {
  MetricsSnapshot m;
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    m.jobs_by_state[StateName(s)] = 0;
  }
  for (v1::WorkerState s : {v1::WORKER_STATE_IDLE, v1::WORKER_STATE_BUSY, v1::WORKER_STATE_DRAINING,
                            v1::WORKER_STATE_LOST}) {
    m.workers_by_state[StateName(s)] = 0;
  }
  absl::MutexLock lock(&state_.mu);
  for (const auto& [id, e] : state_.jobs) {
    const v1::Job& job = e.controller.job();
    ++m.jobs_by_state[StateName(job.state())];
    if (job.state() != v1::JOB_STATE_RUNNING) continue;
    MetricsSnapshot::RunningJob j;
    j.id = id;
    j.step = job.step();
    j.tokens_per_s = job.tokens_per_s();
    if (job.step() >= 0) {
      j.loss = job.loss();
      j.learning_rate = job.learning_rate();
      if (job.has_grad_norm()) j.grad_norm = job.grad_norm();
    }
    if (job.eval_step() > 0) {
      j.eval_loss = job.eval_loss();
      j.eval_accuracy = job.eval_accuracy();
    }
    const int p = job.stages();
    const std::vector<double>& per_step = e.controller.ledger().step_compute_s();
    if (static_cast<int>(per_step.size()) >= p) {
      j.straggler_ratio =
          StragglerRatios(std::vector<double>(per_step.begin(), per_step.begin() + p));
    }
    m.running.push_back(std::move(j));
  }
  for (const v1::WorkerInfo& w : state_.pool.Infos()) ++m.workers_by_state[StateName(w.state())];
  m.workers_lost_silent = workers_.lost_silent();
  m.coordinator_stalls = workers_.stalls_excused();
  m.step_commands = jobs_.command_counts();
  return m;
}

}  // namespace pipetrain::coordinator
