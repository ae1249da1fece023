// The worker's one rank at a time. See stage_slot.h.
#include "worker/stage_slot.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::worker {

StageSlot::StageSlot(std::shared_ptr<const Clock> clock) : clock_(std::move(clock)) {}

StageSlot::~StageSlot() { Shutdown("the worker is shutting down"); }

bool StageSlot::AwaitUntil(const std::function<bool()>& done, absl::Time deadline) {
  while (!done()) {
    const absl::Duration left = deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) return false;
    mu_.AwaitWithTimeout(absl::Condition(&done), std::min(left, kClockPoll));
  }
  return true;
}

absl::Status StageSlot::Start(const std::string& job_id, int rank, int64_t generation,
                              absl::Duration patience, std::function<void()> body) {
  absl::MutexLock lock(&mu_);
  // A rank that has ended (its end being reported) or was told to stop is on its way out.
  AwaitUntil(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return occupant_.job_id.empty() || closed_ ||
               !(occupant_.ending || !occupant_.stop_reason.empty());
      },
      clock_->Now() + patience);
  if (closed_) return absl::UnavailableError(closed_because_);
  if (occupant_.job_id == job_id && occupant_.rank == rank && occupant_.generation == generation &&
      occupant_.stop_reason.empty()) {
    return absl::OkStatus();  // the same assignment again (a retried call): already running
  }
  if (!occupant_.job_id.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("busy with rank ", occupant_.rank, " of ", occupant_.job_id));
  }
  // The previous rank's thread has released the slot: all it has left to do is return.
  if (thread_.joinable()) thread_.join();
  occupant_ = Occupant{job_id, rank, generation, false, ""};
  thread_ = std::thread(std::move(body));
  return absl::OkStatus();
}

void StageSlot::StopLocked(const std::string& why) {
  if (occupant_.job_id.empty() || occupant_.ending) return;
  if (occupant_.stop_reason.empty()) occupant_.stop_reason = why;
  if (stopper_) stopper_(absl::CancelledError(occupant_.stop_reason));
}

void StageSlot::Stop(const std::string& job_id, int64_t generation, const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (occupant_.job_id == job_id && (generation == 0 || generation == occupant_.generation)) {
    StopLocked(why);
  }
}

void StageSlot::StopAny(const std::string& why) {
  absl::MutexLock lock(&mu_);
  StopLocked(why);
}

void StageSlot::Close(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  closed_because_ = why;
}

void StageSlot::Shutdown(const std::string& why) {
  std::thread stage;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_) {
      closed_ = true;
      closed_because_ = why;
    }
    StopLocked(why);
    stage.swap(thread_);
  }
  if (stage.joinable()) stage.join();
}

void StageSlot::SetStopper(std::function<void(const absl::Status&)> stop) {
  absl::MutexLock lock(&mu_);
  stopper_ = std::move(stop);
  if (stopper_ && !occupant_.stop_reason.empty() && !occupant_.ending) {
    stopper_(absl::CancelledError(occupant_.stop_reason));
  }
}

void StageSlot::SetActivitySource(std::function<Activity()> activity) {
  absl::MutexLock lock(&mu_);
  activity_ = std::move(activity);
}

void StageSlot::SetCommandQueue(std::shared_ptr<control::StepCommandQueue> commands) {
  absl::MutexLock lock(&mu_);
  commands_ = std::move(commands);
}

std::string StageSlot::MarkEnded() {
  absl::MutexLock lock(&mu_);
  occupant_.ending = true;
  stopper_ = nullptr;
  activity_ = nullptr;
  commands_.reset();
  return occupant_.stop_reason;
}

void StageSlot::Release() {
  absl::MutexLock lock(&mu_);
  occupant_ = Occupant{};
  stopper_ = nullptr;
  activity_ = nullptr;
  commands_.reset();
}

StageSlot::Occupant StageSlot::occupant() const {
  absl::MutexLock lock(&mu_);
  return occupant_;
}

bool StageSlot::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

StageSlot::Activity StageSlot::activity() const {
  absl::MutexLock lock(&mu_);
  return activity_ ? activity_() : Activity{};
}

std::shared_ptr<control::StepCommandQueue> StageSlot::CommandQueueOf(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  if (occupant_.job_id != job_id || occupant_.rank != 0 || occupant_.ending ||
      !occupant_.stop_reason.empty()) {
    return nullptr;
  }
  return commands_;
}

bool StageSlot::WaitUntilNotRunning(const std::string& job_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return AwaitUntil([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return occupant_.job_id != job_id; },
                    deadline);
}

}  // namespace pipetrain::worker
