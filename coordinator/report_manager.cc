// Step reports, stage ends and stopped ranks from workers: a batch checked whole (report_checks.h,
// each report its rank's next step) before any of it is applied, each then handed to its job's
// controller (job_controller.h). See report_manager.h.
#include "coordinator/report_manager.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/report_checks.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::coordinator {

absl::StatusOr<std::vector<const v1::StepReport*>> ReportManager::CheckReports(
    const std::string& session, const v1::StepReports& reports) {
  std::vector<const v1::StepReport*> apply, late;
  std::map<std::pair<std::string, int>, int64_t> last;  // (job, rank) -> last step so far
  for (const v1::StepReport& r : reports.reports()) {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, state_.Caller(session, r.worker_id()));
    auto it = state_.jobs.find(r.job_id());
    if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
    const JobController& c = it->second.controller;
    if (c.job().state() != v1::JOB_STATE_RUNNING) {
      apply.push_back(&r);  // answered with stop
      continue;
    }
    if (c.phase() == Phase::kRecovering ||
        (r.generation() != 0 && r.generation() != c.job().generation())) {
      // An earlier generation's: its stage is being stopped. While the one that ended decides
      // where its survivors go on, its reports still count (ReportLateStep).
      if (c.TakesLateReport(r.rank(), r.generation(), caller->info.id())) late.push_back(&r);
      continue;
    }
    const std::string where = absl::StrCat("job ", r.job_id(), " rank ", r.rank());
    const std::vector<std::string>& rank_worker = c.rank_worker();
    if (r.rank() < 0 || r.rank() >= static_cast<int>(rank_worker.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no such rank"));
    }
    if (rank_worker[r.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(
          absl::StrCat(where, " runs on ", rank_worker[r.rank()], ", not ", caller->info.id()));
    }
    auto [seen, fresh] =
        last.emplace(std::make_pair(r.job_id(), r.rank()), c.ledger().last_step(r.rank()));
    const StepLedger::Order order = c.ledger().Expects(seen->second, r.step());
    if (order == StepLedger::Order::kResent) continue;  // counted already
    if (order == StepLedger::Order::kOutOfOrder || r.step() < 0 || r.step() >= c.job().steps()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": step ", r.step(), " reported, expected step ", seen->second + 1,
                       " of ", c.job().steps(), " (steps are reported in order)"));
    }
    PT_RETURN_IF_ERROR(CheckStepReportFields(r, c.job().stages(), where));
    seen->second = r.step();
    apply.push_back(&r);
  }
  for (const v1::StepReport* r : late) {
    JobEntry& e = state_.jobs.at(r->job_id());
    e.controller.ReportLateStep(*r);
    state_.Carry(e);
  }
  return apply;
}

absl::StatusOr<v1::ReportResponse> ReportManager::ReportSteps(const std::string& session,
                                                              const v1::StepReports& reports) {
  StateLock lock(&state_);
  PT_ASSIGN_OR_RETURN(std::vector<const v1::StepReport*> apply, CheckReports(session, reports));
  v1::ReportResponse response;
  for (const v1::StepReport* r : apply) {
    absl::StatusOr<v1::ReportResponse> one = ReportStep(*r);
    if (!one.ok()) return one.status();
    if (one->stop()) response.set_stop(true);
  }
  return response;
}

absl::StatusOr<v1::ReportResponse> ReportManager::ReportStep(const v1::StepReport& r) {
  v1::ReportResponse response;
  auto it = state_.jobs.find(r.job_id());
  if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
  JobEntry& e = it->second;
  if (e.controller.job().state() != v1::JOB_STATE_RUNNING) {
    response.set_stop(true);
    return response;
  }
  // An earlier report of this batch ended the generation.
  if (e.controller.phase() == Phase::kRecovering) return response;
  if (r.rank() < 0 || r.rank() >= e.controller.job().stage_status_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), " out of range"));
  }
  e.controller.ReportStep(r);
  state_.Carry(e);
  return response;
}

absl::StatusOr<v1::ReportResponse> ReportManager::ReportStageEnd(const std::string& session,
                                                                 const v1::StageEnd& end) {
  StateLock lock(&state_);
  PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, state_.Caller(session, end.worker_id()));
  auto it = state_.jobs.find(end.job_id());
  if (it != state_.jobs.end() && end.generation() != 0 &&
      end.generation() != it->second.controller.job().generation()) {
    // An earlier generation's rank has ended: its worker is free (PlaceRecovering waits
    // for that); the job is not touched.
    if (caller->info.job_id() == end.job_id() && caller->generation == end.generation()) {
      state_.pool.Release(*caller);
    }
    dispatcher_.Schedule();
    return v1::ReportResponse();
  }
  if (it != state_.jobs.end()) {
    const std::vector<std::string>& rank_worker = it->second.controller.rank_worker();
    if (end.rank() >= 0 && end.rank() < static_cast<int>(rank_worker.size()) &&
        rank_worker[end.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(absl::StrCat("job ", end.job_id(), " rank ", end.rank(),
                                                      " runs on ", rank_worker[end.rank()],
                                                      ", not ", caller->info.id()));
    }
  }
  if (end.error().size() <= JobController::kMaxErrorBytes) return StageEnd(end);
  v1::StageEnd cut = end;  // a cause is kept to its first kMaxErrorBytes
  cut.set_error(absl::StrCat(end.error().substr(0, JobController::kMaxErrorBytes), "..."));
  return StageEnd(cut);
}

absl::StatusOr<v1::ReportResponse> ReportManager::StageEnd(const v1::StageEnd& end) {
  WorkerPool::Worker* w = state_.pool.Find(end.worker_id());
  auto it = state_.jobs.find(end.job_id());
  if (w != nullptr && w->info.job_id() == end.job_id() &&
      (it == state_.jobs.end() || w->generation == it->second.controller.job().generation())) {
    state_.pool.Release(*w);
  }
  if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", end.job_id()));
  it->second.controller.StageEnd(end);
  state_.Carry(it->second);
  dispatcher_.Schedule();
  return v1::ReportResponse();
}

absl::StatusOr<v1::SurvivorInstruction> ReportManager::ReportStopped(const std::string& session,
                                                                     const v1::StoppedRank& s) {
  StateLock lock(&state_);
  PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, state_.Caller(session, s.worker_id()));
  auto it = state_.jobs.find(s.job_id());
  if (it == state_.jobs.end()) return absl::NotFoundError(absl::StrCat("no job ", s.job_id()));
  JobEntry& e = it->second;
  const JobController& c = e.controller;
  const std::string where = absl::StrCat("job ", s.job_id(), " rank ", s.rank());
  if (s.rank() < 0 || s.rank() >= static_cast<int>(c.rank_worker().size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": no such rank"));
  }
  if (s.generation() != c.job().generation() || !IsRunning(c.phase())) {
    v1::SurvivorInstruction abandon;
    abandon.set_action(v1::SurvivorInstruction::ABANDON);
    abandon.set_reason(
        absl::StrCat("generation ", s.generation(), " of ", s.job_id(), " no longer runs"));
    return abandon;
  }
  if (c.rank_worker()[s.rank()] != caller->info.id()) {
    return absl::PermissionDeniedError(
        absl::StrCat(where, " runs on ", c.rank_worker()[s.rank()], ", not ", caller->info.id()));
  }
  absl::StatusOr<v1::SurvivorInstruction> answer = e.controller.Stopped(s);
  state_.Carry(e);
  return answer;
}

}  // namespace pipetrain::coordinator
