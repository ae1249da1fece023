// The coordinator's jobs: each job's controller (job_controller.h) by id, in submission order,
// and the way their changes reach the store. A change bumps the job's version, wakes whoever
// waits for a change (the `on_change` callback) and queues its record, with the steps it
// committed since, for the write-behind writer (write_behind.h); a change that is only
// progress (a step report) is queued at most once a second, every other at once. Events are
// queued there too, and printed on stderr.
//
// Not thread-safe: the coordinator's managers hold its lock around every call
// (coordinator_state.h). The writer it queues into is thread-safe and flushed outside that
// lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/job_controller.h"
#include "coordinator/job_store.h"
#include "coordinator/write_behind.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/base/clock.h"

namespace pipetrain::coordinator {

// One job as the coordinator keeps it: its controller (everything about the job) and how
// its record reaches the store.
struct JobEntry {
  explicit JobEntry(JobController controller) : controller(std::move(controller)) {}
  JobController controller;
  int64_t order = 0;        // submission order (JobTable::Add)
  int64_t version = 0;      // bumped on every change
  bool durable = false;     // its first record is in the store: it may be scheduled
  absl::Time persisted_at;  // progress is written at most once a second
  // Steps committed since its record was last queued for the store: written with it (at
  // most a second apart while it runs, at once on every state change).
  std::vector<StoredStep> unwritten_steps;
};

class JobTable {
 public:
  using Map = std::map<std::string, JobEntry>;

  // `writes` (borrowed, outliving the table): where records, steps and events are queued.
  // `clock`: the time of events and of the once-a-second progress write. `on_change`: called
  // on every change and event.
  JobTable(WriteBehind* writes, std::shared_ptr<Clock> clock, std::function<void()> on_change)
      : writes_(writes), clock_(std::move(clock)), on_change_(std::move(on_change)) {}

  // Adds job `id` as the next in submission order; its entry.
  JobEntry& Add(const std::string& id, JobEntry entry);
  // A submission taken back (its first write failed).
  void Remove(const std::string& id) { jobs_.erase(id); }
  // The submission order the next job added gets.
  int64_t next_order() const { return next_order_; }

  Map::iterator find(const std::string& id) { return jobs_.find(id); }
  Map::iterator end() { return jobs_.end(); }
  Map::iterator begin() { return jobs_.begin(); }
  Map::const_iterator begin() const { return jobs_.begin(); }
  Map::const_iterator end() const { return jobs_.end(); }
  JobEntry& at(const std::string& id) { return jobs_.at(id); }
  bool contains(const std::string& id) const { return jobs_.count(id) > 0; }

  // The entries for which `pick` holds, in submission order.
  std::vector<JobEntry*> InOrder(const std::function<bool(const JobEntry&)>& pick);

  // `entry` changed: see above. `progress_only`: a step report's change.
  void Changed(JobEntry& entry, bool progress_only = false);
  // Carries out what `entry`'s controller asked for the store: its events, its committed
  // steps, its record's write (JobEffects, in that order). The rest of `effects` is the
  // coordinator's.
  void Record(JobEntry& entry, const JobEffects& effects);
  // An event of job `job_id`, at the clock's time.
  void Event(const std::string& job_id, const std::string& text);

 private:
  WriteBehind* const writes_;
  const std::shared_ptr<Clock> clock_;
  const std::function<void()> on_change_;
  Map jobs_;
  int64_t next_order_ = 0;
};

}  // namespace pipetrain::coordinator
