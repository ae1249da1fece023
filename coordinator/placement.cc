#include "coordinator/placement.h"

namespace pipetrain::coordinator {

PlacementPlan PlaceQueuedJobs(const std::vector<QueuedJob>& queued,
                              std::vector<std::string> idle) {
  PlacementPlan plan;
  size_t next = 0;  // idle[next..] are still free
  for (const QueuedJob& job : queued) {
    if (job.ranks < 1 || idle.size() - next < static_cast<size_t>(job.ranks)) {
      plan.waiting.push_back(job.id);
      continue;
    }
    Placement p{job.id, {}};
    for (int r = 0; r < job.ranks; ++r) p.rank_workers.push_back(idle[next++]);
    plan.started.push_back(std::move(p));
  }
  return plan;
}

}  // namespace pipetrain::coordinator
