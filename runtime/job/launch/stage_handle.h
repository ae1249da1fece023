// A running rank as other threads reach it: stop it, ask what it does now. The host makes
// one, hands it to RunStage (StageRunOptions::handle) and keeps it for as long as it may stop
// the rank; RunStage attaches the rank's transport once the data plane is up and its executor
// once built, and detaches each before it goes. A stop reaches whatever is attached (the
// executor, else the transport), and one that came before a part was attached reaches that
// part as it is attached, so that no stop is lost between the phases of a run.
// Thread-safe: every method may be called from any thread.
#pragma once

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/transport/transport.h"

namespace pipetrain::job {

class StageHandle {
 public:
  // Stops the rank with `why` (the first reason is kept): its executor fails before its next
  // action, or, before and after the executor, its transport's waits end with `why`.
  void Stop(const absl::Status& why);
  // The first stop's reason; OK if none came.
  absl::Status stop_reason() const;
  // What the rank's executor does now; nullopt while none runs.
  std::optional<executor::StageActivity> Activity() const;

  // RunStage's side. A part attached after a stop is stopped at once; nullptr detaches.
  // REQUIRES: the part outlives its attachment.
  void AttachTransport(transport::Transport* transport);
  void AttachExecutor(executor::StageExecutor* executor);

 private:
  mutable absl::Mutex mu_;
  transport::Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  executor::StageExecutor* executor_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::job
