// The coordinator's durable state: every job (its latest serialized pipetrain.v1.Job) and
// every job's events, in one SQLite file that survives restarts. Writes are transactions
// committed before the call returns (WAL journal, synchronous=FULL).
// Thread-safe (one connection behind a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

struct sqlite3;

namespace pipetrain::coordinator {

struct StoredJob {
  std::string id;
  std::string job;  // serialized pipetrain.v1.Job
};

struct StoredEvent {
  int64_t seq = 0;  // per job, from 1
  int64_t unix_ms = 0;
  std::string text;
};

class JobStore {
 public:
  // Opens or creates the database at `path` (its tables created if missing).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // Inserts or replaces job `id`; `order` fixes its place in LoadJobs (submission order).
  absl::Status PutJob(const std::string& id, int64_t order, const std::string& job);
  absl::StatusOr<std::vector<StoredJob>> LoadJobs();
  // Appends an event; returns its sequence number.
  absl::StatusOr<int64_t> AppendEvent(const std::string& job_id, int64_t unix_ms,
                                      const std::string& text);
  absl::StatusOr<std::vector<StoredEvent>> Events(const std::string& job_id, int64_t after_seq);
  // Adds one to the counter `name` (0 when first used) and returns it: numbers that are never
  // handed out twice, across restarts (worker ids).
  absl::StatusOr<int64_t> Increment(const std::string& name);

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);
  std::mutex mu_;
  sqlite3* db_;
};

}  // namespace pipetrain::coordinator
