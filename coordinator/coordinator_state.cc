// What the coordinator's managers share. See coordinator_state.h.
#include "coordinator/coordinator_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

CoordinatorState::CoordinatorState(const CoordinatorOptions& options, std::shared_ptr<Clock> clock,
                                   JobStore* store,
                                   std::function<void(std::function<void()>)> run_later)
    : options(options),
      clock(std::move(clock)),
      store(store),
      writes(store),
      jobs(&writes, this->clock, [this] { changed.SignalAll(); }),
      run_later_(std::move(run_later)) {}

int64_t CoordinatorState::NowMs() const { return absl::ToUnixMillis(clock->Now()); }

JobController::Settings CoordinatorState::JobSettings() const {
  return JobController::Settings{clock, options.heartbeat_interval};
}

absl::Status CoordinatorState::FlushWrites() { return writes.Flush(); }

void CoordinatorState::Later(std::function<void()> call) { run_later_(std::move(call)); }

void CoordinatorState::Carry(JobEntry& entry) {
  const JobEffects effects = entry.controller.TakeEffects();
  const std::string& id = entry.controller.id();
  switch (effects.rendezvous) {
    case JobEffects::Store::kUnchanged: break;
    case JobEffects::Store::kOpen: rendezvous.Open(id); break;
    case JobEffects::Store::kClose: rendezvous.Close(id); break;
  }
  if (effects.began_holding) holding_jobs.insert(id);
  for (const JobEffects::Stop& stop : effects.stops) {
    WorkerPool::Worker* w = pool.Find(stop.worker_id);
    if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) continue;
    std::shared_ptr<WorkerClient> client = w->client;
    v1::StopStageRequest request;
    request.set_job_id(id);
    request.set_generation(stop.generation);
    request.set_reason(stop.reason);
    Later([client, request] { (void)client->StopStage(request); });
  }
  jobs.Record(entry, effects);
}

absl::StatusOr<WorkerPool::Worker*> CoordinatorState::Caller(const std::string& session,
                                                             const std::string& worker_id) {
  WorkerPool::Worker* w = pool.FindBySession(session);
  if (w == nullptr) {
    return absl::NotFoundError(
        session.empty() ? "no worker session: register first"
                        : "unknown worker session (the coordinator restarted?): register again");
  }
  if (!worker_id.empty() && worker_id != w->info.id()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the session of ", w->info.id(), " cannot speak for ", worker_id));
  }
  return w;
}

}  // namespace pipetrain::coordinator
