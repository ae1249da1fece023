// The survivors of a fault as the coordinator serves them: a stopped rank's report checked
// to be the caller's rank of the job's running generation, then its job's controller decides
// (job_controller.h); and the jobs whose survivors' state a worker holds. See coordinator.h.
#include "coordinator/coordinator.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::coordinator {

absl::StatusOr<v1::SurvivorInstruction> Coordinator::ReportStopped(const std::string& session,
                                                                   const v1::StoppedRank& s) {
  return LockedThenFlush(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<v1::SurvivorInstruction> {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, s.worker_id()));
    auto it = jobs_.find(s.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", s.job_id()));
    JobEntry& e = it->second;
    const JobController& c = e.controller;
    const std::string where = absl::StrCat("job ", s.job_id(), " rank ", s.rank());
    if (s.rank() < 0 || s.rank() >= static_cast<int>(c.rank_worker().size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no such rank"));
    }
    if (s.generation() != c.job().generation() || !IsRunning(c.phase())) {
      v1::SurvivorInstruction abandon;
      abandon.set_action(v1::SurvivorInstruction::ABANDON);
      abandon.set_reason(absl::StrCat("generation ", s.generation(), " of ", s.job_id(),
                                      " no longer runs"));
      return abandon;
    }
    if (c.rank_worker()[s.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(absl::StrCat(where, " runs on ",
                                                      c.rank_worker()[s.rank()], ", not ",
                                                      caller->info.id()));
    }
    absl::StatusOr<v1::SurvivorInstruction> answer = e.controller.Stopped(s);
    Carry(e);
    return answer;
  });
}

std::vector<std::string> Coordinator::HeldStateJobsOf(const std::string& worker_id) {
  std::vector<std::string> out;
  for (auto it = holding_jobs_.begin(); it != holding_jobs_.end();) {
    auto j = jobs_.find(*it);
    if (j == jobs_.end() || !j->second.controller.KeepsHeldState()) {
      it = holding_jobs_.erase(it);
      continue;
    }
    if (j->second.controller.held_state()->HeldBy(worker_id)) out.push_back(*it);
    ++it;
  }
  return out;
}

}  // namespace pipetrain::coordinator
