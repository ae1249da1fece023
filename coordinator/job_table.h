// The coordinator's jobs: each job's record and run (JobEntry) by id, in submission order,
// and the way their changes reach the store. A change bumps the job's version, wakes whoever
// waits for a change (the `on_change` callback) and queues its record, with the steps it
// committed since, for the write-behind writer (write_behind.h); a change that is only
// progress (a step report) is queued at most once a second, every other at once. Events are
// queued there too, and printed on stderr.
//
// Not thread-safe: the coordinator's shell holds its lock around every call. The writer it
// queues into is thread-safe and flushed by the shell outside that lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/job_machine.h"
#include "coordinator/job_store.h"
#include "coordinator/restart_point.h"
#include "coordinator/step_ledger.h"
#include "coordinator/survivor_hold.h"
#include "coordinator/survivor_round.h"
#include "coordinator/write_behind.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "runtime/base/clock.h"
#include "runtime/job/job_config.h"

namespace pipetrain::coordinator {

// One job as the coordinator keeps it.
struct JobEntry {
  v1::Job job;
  job::JobConfig config;
  int64_t order = 0;     // submission order (JobTable::Add)
  int64_t version = 0;   // bumped on every change
  bool durable = false;  // its first record is in the store: it may be scheduled
  JobRun run;  // its lifecycle (job_machine.h); job.state, restarts, generation mirror it
  std::vector<std::string> rank_worker;  // worker id per rank
  StepLedger ledger;  // the generation's steps: per rank, committed, losses, throughput
  std::vector<int> assign_attempts;  // assignments tried per rank
  int64_t tokens_per_step = 0;
  absl::Time persisted_at;        // progress is written at most once a second
  std::string requeued_because;  // why a job that ran waits in the queue again (Requeue)
  // Generations (coordinator.h, Recovery; job.generation() is the one its ranks run now).
  v1::JobSpec run_spec;         // what they run: the spec with the layout and resume point
  absl::Time recovering_since;  // when its last generation ended (phase kRecovering)
  // Until when a rank of this generation on a worker taken for lost (silent, maybe only cut
  // off) may still run: its lease from its last heartbeat, and an interval to stop. The next
  // generation is not placed before (no two generations' ranks at once).
  absl::Time lost_ranks_stop_by = absl::InfinitePast();
  // Steps committed since its record was last queued for the store: written with it (at
  // most a second apart while it runs, at once on every state change).
  std::vector<StoredStep> unwritten_steps;
  // Its restart point as this generation moves it: the checkpoint a rank reported committing
  // and a drain waiting for its checkpoint (restart_point.h).
  RestartPoint restart_point;
  // The generation runs with the step commit (StageAssignment.commit_steps): after a rank
  // failed or was lost, its survivors report, and the round decides where the job goes on.
  bool commit_steps = false;
  std::optional<SurvivorRound> survivors;  // this generation's round, once one began
  // The state the survivors of its last round hold in their workers' memory (from the
  // round's decision until the job has committed that step again, or the job ended), which
  // a generation starting at `step` takes instead of reading the checkpoint.
  std::optional<SurvivorHold> held_state;
  // What the running generation's assignments say of it (empty: nothing held for it).
  v1::ReplicaState replica_state;
  // The steps whose update was skipped (a non-finite loss or gradient), as this coordinator
  // process learnt of them (a rank's report; a step run again and committed without a skip
  // leaves): a step run again after a restart counts once, and the steps skipped in a row
  // before a generation's first count toward its nonfinite_limit
  // (StageAssignment.skipped_in_a_row).
  std::set<int64_t> skipped_steps;
};

// How many of the steps right before `step` are in `skipped`, in a row.
int SkippedInARowBefore(const std::set<int64_t>& skipped, int64_t step);

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
