// The first reason a transport was aborted with, kept: once latched, every later call of the
// transport returns it, so that every stage of a failing job stops with the first error
// (transport.h). Every transport keeps its abort here. Thread-safe; its lock is a leaf (taken
// under any of the transport's own, never the other way round).
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pipetrain::transport {

class AbortLatch {
 public:
  // Keeps `reason` if it is not OK and nothing was kept yet; whether this call kept it.
  bool Latch(const absl::Status& reason) {
    absl::MutexLock lock(&mu_);
    if (!reason_.ok() || reason.ok()) return false;
    reason_ = reason;
    return true;
  }
  // The kept reason; OK while the transport is not aborted.
  absl::Status reason() const {
    absl::MutexLock lock(&mu_);
    return reason_;
  }
  bool latched() const { return !reason().ok(); }

 private:
  mutable absl::Mutex mu_;
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::transport
