#include "runtime/job/launch/stage_handle.h"

namespace pipetrain::job {

void StageHandle::Stop(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (stopped_.ok()) stopped_ = why.ok() ? absl::CancelledError("stopped") : why;
  if (executor_ != nullptr) {
    executor_->Stop(stopped_);
  } else if (transport_ != nullptr) {
    transport_->Abort(stopped_);
  }
}

absl::Status StageHandle::stop_reason() const {
  absl::MutexLock lock(&mu_);
  return stopped_;
}

std::optional<executor::StageActivity> StageHandle::Activity() const {
  absl::MutexLock lock(&mu_);
  if (executor_ == nullptr) return std::nullopt;
  return executor_->Activity();
}

void StageHandle::AttachTransport(transport::Transport* transport) {
  absl::MutexLock lock(&mu_);
  transport_ = transport;
  if (transport_ != nullptr && !stopped_.ok()) transport_->Abort(stopped_);
}

void StageHandle::AttachExecutor(executor::StageExecutor* executor) {
  absl::MutexLock lock(&mu_);
  executor_ = executor;
  if (executor_ != nullptr && !stopped_.ok()) executor_->Stop(stopped_);
}

}  // namespace pipetrain::job
