// The coordinator's jobs and their way to the store. See job_table.h.
#include "coordinator/job_table.h"

#include <algorithm>
#include <cstdio>

namespace pipetrain::coordinator {

int SkippedInARowBefore(const std::set<int64_t>& skipped, int64_t step) {
  int n = 0;
  while (skipped.count(step - 1 - n) > 0) ++n;
  return n;
}

JobEntry& JobTable::Add(const std::string& id, JobEntry entry) {
  entry.order = next_order_++;
  return jobs_.emplace(id, std::move(entry)).first->second;
}

std::vector<JobEntry*> JobTable::InOrder(const std::function<bool(const JobEntry&)>& pick) {
  std::vector<JobEntry*> picked;
  for (auto& [id, e] : jobs_) {
    if (pick(e)) picked.push_back(&e);
  }
  std::sort(picked.begin(), picked.end(),
            [](const JobEntry* a, const JobEntry* b) { return a->order < b->order; });
  return picked;
}

void JobTable::Changed(JobEntry& entry, bool progress_only) {
  ++entry.version;
  on_change_();
  const absl::Time now = clock_->Now();
  if (progress_only && now - entry.persisted_at < absl::Seconds(1)) return;
  entry.persisted_at = now;
  writes_->QueueSteps(entry.job.id(), entry.unwritten_steps);
  entry.unwritten_steps.clear();
  writes_->QueueJob(entry.job.id(), entry.order, entry.job.SerializeAsString());
}

void JobTable::Event(const std::string& job_id, const std::string& text) {
  writes_->QueueEvent(job_id, absl::ToUnixMillis(clock_->Now()), text);
  std::fprintf(stderr, "coordinator: %s: %s\n", job_id.c_str(), text.c_str());
  on_change_();
}

}  // namespace pipetrain::coordinator
