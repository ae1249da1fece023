// The coordinator's writes to its JobStore, queued where a change is made and written later
// by whoever calls Flush(), so that no store write (an fsync) is made under the lock the
// coordinator's handlers take.
//
// What is queued: each job's latest record (a newer one replaces one not yet written), the
// steps a job committed, and events. Flush writes, in this order, every queued step row, then
// every job record, then every event: a record never names a checkpoint whose earlier steps
// are not in the store. A write that fails stays queued (a job record unless a newer one was
// queued meanwhile; step rows before any queued since, so the later rows win) and that job's
// events of the batch are dropped with it; the next Flush tries again.
//
// Thread-safe. Queue* and Discard may be called under any lock of the caller (they take only
// this object's queue lock, briefly); Flush must not be called under a lock that Queue*
// callers hold while waiting for it. One Flush runs at a time, so writes land in the order
// they were queued. The store is borrowed and must outlive this object.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_store.h"

namespace pipetrain::coordinator {

class WriteBehind {
 public:
  explicit WriteBehind(JobStore* store) : store_(store) {}

  // Job `id`'s latest record (serialized pipetrain.v1.Job) at its submission `order`.
  void QueueJob(const std::string& id, int64_t order, std::string record);
  // Steps job `id` committed, after any of its rows already queued.
  void QueueSteps(const std::string& id, const std::vector<StoredStep>& rows);
  void QueueEvent(const std::string& job_id, int64_t unix_ms, std::string text);
  // Drops job `id`'s queued record and events. True if a record was still queued (its write
  // has not succeeded): how a submission whose write failed is taken back.
  bool Discard(const std::string& id);

  // Writes everything queued so far; returns the first failure (also printed to stderr).
  absl::Status Flush();

 private:
  struct QueuedJob {
    int64_t order = 0;
    std::string record;
  };
  struct QueuedEvent {
    std::string job_id;
    int64_t unix_ms = 0;
    std::string text;
  };

  JobStore* const store_;
  absl::Mutex flush_mu_;  // one Flush at a time; taken before queue_mu_
  absl::Mutex queue_mu_;
  std::map<std::string, QueuedJob> jobs_ ABSL_GUARDED_BY(queue_mu_);
  std::vector<QueuedEvent> events_ ABSL_GUARDED_BY(queue_mu_);
  std::map<std::string, std::vector<StoredStep>> steps_ ABSL_GUARDED_BY(queue_mu_);
};

}  // namespace pipetrain::coordinator
