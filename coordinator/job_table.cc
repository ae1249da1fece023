// The coordinator's jobs and their way to the store. See job_table.h.
#include "coordinator/job_table.h"

#include <algorithm>
#include <cstdio>

namespace pipetrain::coordinator {

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
  writes_->QueueSteps(entry.controller.id(), entry.unwritten_steps);
  entry.unwritten_steps.clear();
  writes_->QueueJob(entry.controller.id(), entry.order, entry.controller.job().SerializeAsString());
}

void JobTable::Record(JobEntry& entry, const JobEffects& effects) {
  for (const std::string& text : effects.events) Event(entry.controller.id(), text);
  entry.unwritten_steps.insert(entry.unwritten_steps.end(), effects.steps.begin(),
                               effects.steps.end());
  if (effects.write != JobEffects::Write::kNone) {
    Changed(entry, effects.write == JobEffects::Write::kProgress);
  }
}

void JobTable::Event(const std::string& job_id, const std::string& text) {
  writes_->QueueEvent(job_id, absl::ToUnixMillis(clock_->Now()), text);
  std::fprintf(stderr, "coordinator: %s: %s\n", job_id.c_str(), text.c_str());
  on_change_();
}

}  // namespace pipetrain::coordinator
