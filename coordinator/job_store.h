// The coordinator's durable state: every job (its latest serialized pipetrain.v1.Job) and
// every job's events. The interface, and its SQLite implementation (one file that survives
// restarts); tests put a fake behind the interface to make writes fail.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::coordinator {

struct StoredJob {
  std::string id;
  std::string job;  // serialized pipetrain.v1.Job
};

// One step of a job as committed: every rank of one generation finished it. A step run
// again after a restart replaces the earlier row (each step is kept once).
struct StoredStep {
  int64_t step = 0;
  int32_t generation = 0;
  bool has_loss = false;
  double loss = 0;
  int64_t unix_ms = 0;
  bool has_grad_norm = false;  // with clipping: the gradient norm before it
  double grad_norm = 0;
  bool has_eval = false;  // with evaluation: the held-out loss and accuracy right after it
  double eval_loss = 0;
  double eval_accuracy = 0;
  // Not stored: the optimizer's schedule at `step` (Coordinator::Steps fills it in).
  double learning_rate = 0;
};

struct StoredEvent {
  int64_t seq = 0;  // per job, from 1
  int64_t unix_ms = 0;
  std::string text;
};

// Where the coordinator keeps its durable state. Implementations are thread-safe; a call that
// returns OK has made its write durable.
class JobStore {
 public:
  virtual ~JobStore() = default;
  // Inserts or replaces job `id`; `order` fixes its place in LoadJobs (submission order).
  virtual absl::Status PutJob(const std::string& id, int64_t order, const std::string& job) = 0;
  virtual absl::StatusOr<std::vector<StoredJob>> LoadJobs() = 0;
  // Appends an event; returns its sequence number.
  virtual absl::StatusOr<int64_t> AppendEvent(const std::string& job_id, int64_t unix_ms,
                                              const std::string& text) = 0;
  // At most `limit` events after `after_seq`, in order.
  virtual absl::StatusOr<std::vector<StoredEvent>> Events(const std::string& job_id,
                                                          int64_t after_seq, int64_t limit) = 0;
  // Inserts or replaces the rows of `steps` (by step), in one write.
  virtual absl::Status PutSteps(const std::string& job_id,
                                const std::vector<StoredStep>& steps) = 0;
  // At most `limit` steps after `after_step`, in order.
  virtual absl::StatusOr<std::vector<StoredStep>> Steps(const std::string& job_id,
                                                        int64_t after_step, int64_t limit) = 0;
  // Adds `by` (>= 1) to the counter `name` (0 when first used) and returns the new value:
  // the numbers value - by + 1 .. value are the caller's, never handed out twice, across
  // restarts (worker ids, reserved in blocks: one write per block).
  virtual absl::StatusOr<int64_t> Increment(const std::string& name, int64_t by) = 0;
};

// The SQLite file at `path`, opened or created (its tables created if missing). Writes are
// transactions committed before the call returns (WAL journal, synchronous=FULL); one
// connection behind a mutex.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteJobStore(const std::string& path);

}  // namespace pipetrain::coordinator
