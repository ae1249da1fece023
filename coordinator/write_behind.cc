#include "coordinator/write_behind.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace pipetrain::coordinator {

void WriteBehind::QueueJob(const std::string& id, int64_t order, std::string record) {
  absl::MutexLock lock(&queue_mu_);
  jobs_[id] = {order, std::move(record)};
}

void WriteBehind::QueueSteps(const std::string& id, const std::vector<StoredStep>& rows) {
  if (rows.empty()) return;
  absl::MutexLock lock(&queue_mu_);
  std::vector<StoredStep>& queued = steps_[id];
  queued.insert(queued.end(), rows.begin(), rows.end());
}

void WriteBehind::QueueEvent(const std::string& job_id, int64_t unix_ms, std::string text) {
  absl::MutexLock lock(&queue_mu_);
  events_.push_back({job_id, unix_ms, std::move(text)});
}

bool WriteBehind::Discard(const std::string& id) {
  absl::MutexLock lock(&queue_mu_);
  if (jobs_.erase(id) == 0) return false;
  steps_.erase(id);
  events_.erase(std::remove_if(events_.begin(), events_.end(),
                               [&](const QueuedEvent& e) { return e.job_id == id; }),
                events_.end());
  return true;
}

absl::Status WriteBehind::Flush() {
  absl::MutexLock flush_lock(&flush_mu_);
  std::map<std::string, QueuedJob> jobs;
  std::vector<QueuedEvent> events;
  std::map<std::string, std::vector<StoredStep>> steps;
  {
    absl::MutexLock lock(&queue_mu_);
    jobs.swap(jobs_);
    events.swap(events_);
    steps.swap(steps_);
  }
  absl::Status first;
  std::map<std::string, QueuedJob> failed;
  // Committed steps before the job records that count them.
  std::map<std::string, std::vector<StoredStep>> steps_failed;
  for (auto& [id, rows] : steps) {
    if (absl::Status s = store_->PutSteps(id, rows); !s.ok()) {
      if (first.ok()) first = s;
      steps_failed.emplace(id, std::move(rows));
    }
  }
  for (auto& [id, job] : jobs) {
    if (steps_failed.count(id)) {  // kept back with its steps, written again with them
      failed.emplace(id, std::move(job));
      continue;
    }
    absl::Status s = store_->PutJob(id, job.order, job.record);
    if (s.ok()) continue;
    if (first.ok()) first = s;
    failed.emplace(id, std::move(job));
  }
  for (const QueuedEvent& e : events) {
    if (failed.count(e.job_id)) continue;
    if (auto s = store_->AppendEvent(e.job_id, e.unix_ms, e.text); !s.ok() && first.ok()) {
      first = s.status();
    }
  }
  if (!failed.empty() || !steps_failed.empty()) {
    absl::MutexLock lock(&queue_mu_);
    for (auto& [id, job] : failed) jobs_.emplace(id, std::move(job));  // unless newer
    for (auto& [id, rows] : steps_failed) {  // before any queued since: the later rows win
      std::vector<StoredStep>& queued = steps_[id];
      queued.insert(queued.begin(), rows.begin(), rows.end());
    }
  }
  if (!first.ok()) std::fprintf(stderr, "coordinator: %s\n", std::string(first.message()).c_str());
  return first;
}

}  // namespace pipetrain::coordinator
