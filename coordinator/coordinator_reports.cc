// Step reports and stage ends from workers: a batch checked whole (report_checks.h, each
// report its rank's next step) before any of it is applied; steps counted by the step ledger
// (step_ledger.h), checkpoints committed once every step before them is, commands taking
// effect, and a rank's end handed to the job machine. See coordinator.h.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/report_checks.h"
#include "jobspec/job_config_from_spec.h"
#include "jobspec/step_commands.h"
#include "proto/states.h"
#include "runtime/base/status_macros.h"
#include "runtime/control/step_commands.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::coordinator {

absl::StatusOr<std::vector<const v1::StepReport*>> Coordinator::CheckReportsLocked(
    const std::string& session, const v1::StepReports& reports) {
  std::vector<const v1::StepReport*> apply, late;
  std::map<std::pair<std::string, int>, int64_t> last;  // (job, rank) -> last step so far
  for (const v1::StepReport& r : reports.reports()) {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, r.worker_id()));
    auto it = jobs_.find(r.job_id());
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
    const JobEntry& e = it->second;
    if (e.job.state() != v1::JOB_STATE_RUNNING) {
      apply.push_back(&r);  // answered with stop
      continue;
    }
    if (e.run.phase == Phase::kRecovering ||
        (r.generation() != 0 && r.generation() != e.job.generation())) {
      // An earlier generation's: its stage is being stopped. While the one that ended decides
      // where its survivors go on, its reports still count (RecordLateStep).
      if (e.run.phase == Phase::kRecovering && r.generation() == e.job.generation() &&
          e.survivors && !e.survivors->decided() && r.rank() >= 0 &&
          r.rank() < static_cast<int>(e.rank_worker.size()) &&
          e.rank_worker[r.rank()] == caller->info.id()) {
        late.push_back(&r);
      }
      continue;
    }
    const std::string where = absl::StrCat("job ", r.job_id(), " rank ", r.rank());
    if (r.rank() < 0 || r.rank() >= static_cast<int>(e.rank_worker.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no such rank"));
    }
    if (e.rank_worker[r.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(
          absl::StrCat(where, " runs on ", e.rank_worker[r.rank()], ", not ", caller->info.id()));
    }
    auto [seen, fresh] = last.emplace(std::make_pair(r.job_id(), r.rank()),
                                      e.ledger.last_step(r.rank()));
    const StepLedger::Order order = e.ledger.Expects(seen->second, r.step());
    if (order == StepLedger::Order::kResent) continue;  // counted already
    if (order == StepLedger::Order::kOutOfOrder || r.step() < 0 || r.step() >= e.job.steps()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": step ", r.step(), " reported, expected step ", seen->second + 1, " of ",
          e.job.steps(), " (steps are reported in order)"));
    }
    PT_RETURN_IF_ERROR(CheckStepReportFields(r, e.job.stages(), where));
    seen->second = r.step();
    apply.push_back(&r);
  }
  for (const v1::StepReport* r : late) RecordLateStep(jobs_.at(r->job_id()), *r);
  return apply;
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportSteps(const std::string& session,
                                                            const v1::StepReports& reports) {
  return LockedThenFlush(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<v1::ReportResponse> {
    PT_ASSIGN_OR_RETURN(std::vector<const v1::StepReport*> apply,
                        CheckReportsLocked(session, reports));
    v1::ReportResponse response;
    for (const v1::StepReport* r : apply) {
      absl::StatusOr<v1::ReportResponse> one = ReportStepLocked(*r);
      if (!one.ok()) return one.status();
      if (one->stop()) response.set_stop(true);
    }
    return response;
  });
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportStepLocked(const v1::StepReport& r) {
  v1::ReportResponse response;
  auto it = jobs_.find(r.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", r.job_id()));
  JobEntry& e = it->second;
  if (e.job.state() != v1::JOB_STATE_RUNNING) {
    response.set_stop(true);
    return response;
  }
  // An earlier report of this batch ended the generation.
  if (e.run.phase == Phase::kRecovering) return response;
  if (r.rank() < 0 || r.rank() >= e.job.stage_status_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), " out of range"));
  }
  // The job restarts from it once every step before it is committed here too (below).
  e.restart_point.Reported(r.step() + 1, r.checkpoint_committed(), e.job.checkpoint_step());
  v1::StageStatus* st = e.job.mutable_stage_status(r.rank());
  st->set_step(r.step());
  st->set_compute_s(r.compute_s());
  st->set_wait_s(r.wait_s());
  st->set_parameter_bytes(r.parameter_bytes());
  st->set_peak_memory_bytes(r.peak_memory_bytes());
  st->set_peak_tensor_bytes(r.peak_tensor_bytes());
  st->set_layers_begin(r.layers_begin());
  st->set_layers_end(r.layers_end());
  *st->mutable_breakdown() = r.breakdown();
  st->set_state(v1::STAGE_STATE_RUNNING);
  const StepLedger::Recorded recorded = e.ledger.Record(r);
  e.job.set_step(e.ledger.committed());
  for (size_t s = 0; s < recorded.straggler_ratios.size(); ++s) {
    e.job.mutable_stage_status(recorded.replica_first_rank + static_cast<int>(s))
        ->set_straggler_ratio(recorded.straggler_ratios[s]);
  }
  if (recorded.tokens_per_s) e.job.set_tokens_per_s(*recorded.tokens_per_s);
  if (recorded.step_time_s) e.job.set_step_time_s(*recorded.step_time_s);
  if (!r.resumed_from().empty() && r.rank() == 0) {
    e.job.set_resumed_from(r.resumed_from().substr(0, 4096));
    e.job.clear_checkpoints_passed_over();
    for (int i = 0; i < r.passed_over_size() && i < 16; ++i) {
      const std::string why = r.passed_over(i).substr(0, kMaxErrorBytes);
      *e.job.add_checkpoints_passed_over() = why;
      jobs_.Event(e.job.id(), absl::StrCat("resuming: passed over ", why));
    }
    jobs_.Event(e.job.id(), absl::StrCat("resumed from ", e.job.resumed_from(),
                                   r.passed_over_size() > 0
                                       ? absl::StrCat(" (", r.passed_over_size(),
                                                      " newer checkpoint(s) passed over)")
                                       : std::string()));
  }
  if (!r.state_from_replicas().empty() && r.rank() == 0) {
    // This generation read no checkpoint.
    e.job.clear_resumed_from();
    e.job.clear_checkpoints_passed_over();
  }
  if (!r.state_from_replicas().empty() && r.rank() < kRanksNamed) {
    jobs_.Event(e.job.id(), absl::StrCat(RankName(e.job, r.rank()), " took ",
                                         r.state_from_replicas().substr(0, kMaxErrorBytes)));
  }
  // Every rank skips the same steps: the first report of a skip counts it (the step that
  // fails a job by its nonfinite_limit may be reported by one rank only before the others
  // stop), a step run again after a restart once.
  if (r.skipped() && e.skipped_steps.insert(r.step()).second) {
    e.job.set_skipped_steps(e.job.skipped_steps() + 1);
    jobs_.Event(e.job.id(), absl::StrCat("step ", r.step(), " skipped: its loss or gradients "
                                         "were not finite (weights and optimizer state "
                                         "unchanged)"));
  }
  if (!r.checkpoint_failed().empty()) {
    jobs_.Event(e.job.id(), absl::StrCat("checkpoint before step ", r.step() + 1, " failed on ",
                                   RankName(e.job, r.rank()), ": ",
                                   r.checkpoint_failed().substr(0, kMaxErrorBytes),
                                   " (the job goes on; its restart point stays at step ",
                                   e.job.checkpoint_step(), ")"));
  }
  // After the last step only the policy's final checkpoint comes: its commit is its event.
  if (r.commands_after_size() > 0 && r.step() + 1 < e.config.steps &&
      commands_.TookEffect(e.job.id(), r.step() + 1, e.job.stage_status_size())) {
    uint32_t bits = 0;
    for (int c : r.commands_after()) bits |= jobspec::StepCommandBit(static_cast<v1::StepCommand>(c));
    jobs_.Event(e.job.id(), absl::StrCat(control::StepCommandsName(bits), " took effect before step ",
                                   r.step() + 1, " on all ", e.job.stage_status_size(),
                                   " ranks"));
  }
  if (!recorded.committed.empty()) {
    CommitSteps(e, recorded.committed);
    const int64_t done = e.job.step();
    const RestartPoint::Decision moved =
        e.restart_point.Committed(done, e.job.checkpoint_step(), e.config.steps);
    if (moved.final_one) {
      jobs_.Event(e.job.id(), absl::StrCat("final checkpoint (after step ",
                                           moved.final_one->step - 1,
                                           ") committed: ", moved.final_one->dir));
    }
    if (moved.restart_point) {
      // Written at once, with the rows of the steps before it (FlushWrites writes steps
      // first): a restart finds every step before the checkpoint it resumes from.
      e.job.set_checkpoint_step(moved.restart_point->step);
      e.job.set_checkpoint_path(moved.restart_point->dir);
      jobs_.Event(e.job.id(), absl::StrCat("checkpoint before step ", e.job.checkpoint_step(),
                                     " committed: ", e.job.checkpoint_path()));
      jobs_.Changed(e);
    }
    if (moved.drained) {
      ApplyEvent(e, Fault{*moved.drained});
      return response;
    }
    if (e.job.recoveries_size() > 0 &&
        e.job.recoveries(e.job.recoveries_size() - 1).generation() == e.job.generation() &&
        e.job.recoveries(e.job.recoveries_size() - 1).first_step_unix_ms() == 0) {
      v1::Recovery* rec = e.job.mutable_recoveries(e.job.recoveries_size() - 1);
      rec->set_first_step_unix_ms(NowMs());
      jobs_.Event(e.job.id(), absl::StrFormat(
                            "generation %d: step %d done by every rank, %.2f s after the fault "
                            "(placed after %.2f s)",
                            e.job.generation(), done, (rec->first_step_unix_ms() - rec->detected_unix_ms()) / 1e3,
                            (rec->placed_unix_ms() - rec->detected_unix_ms()) / 1e3));
      jobs_.Changed(e);
    }
    const int64_t every = std::max(1, e.job.steps() / 10);
    if ((done + 1) % every == 0 || done + 1 == e.job.steps()) {
      jobs_.Event(e.job.id(),
                  absl::StrCat(absl::StrFormat("step %d/%d loss %.4f lr %.3g", done + 1,
                                               e.job.steps(), e.job.loss(),
                                               e.job.learning_rate()),
                               e.job.has_grad_norm()
                                   ? absl::StrFormat(" grad norm %.4g", e.job.grad_norm())
                                   : std::string(),
                               absl::StrFormat(" %.0f %s/s", e.job.tokens_per_s(),
                                               e.job.data_unit())));
    }
  }
  jobs_.Changed(e, /*progress_only=*/true);
  return response;
}

void Coordinator::CommitSteps(JobEntry& e,
                              const std::vector<StepLedger::CommittedStep>& steps) {
  // The loss of a step is known once every replica's last stage reported it. The step is
  // committed: its row (replacing one an earlier generation wrote) goes to the store.
  for (const StepLedger::CommittedStep& step : steps) {
    StoredStep row;
    row.step = step.step;
    row.generation = e.job.generation();
    row.unix_ms = NowMs();
    if (step.loss) {
      // The job's loss is its last finite one: a skipped step's may be NaN.
      if (std::isfinite(*step.loss)) e.job.set_loss(*step.loss);
      row.has_loss = true;
      row.loss = *step.loss;
    }
    // A step skipped in a generation that did not get past it, and not skipped when run
    // again, no longer counts (its skip is counted when reported: ReportStepLocked).
    if (!step.skipped && e.skipped_steps.erase(step.step) > 0) {
      e.job.set_skipped_steps(std::max<int64_t>(0, e.job.skipped_steps() - 1));
    }
    e.job.set_learning_rate(
        weights::LearningRateAt(e.config.optimizer, step.step, e.config.steps));
    e.job.set_has_grad_norm(step.grad_norm.has_value());
    if (step.grad_norm) {
      e.job.set_grad_norm(*step.grad_norm);
      row.has_grad_norm = true;
      row.grad_norm = *step.grad_norm;
    }
    if (step.eval_loss && step.eval_accuracy) {
      e.job.set_eval_step(step.step + 1);
      e.job.set_eval_loss(*step.eval_loss);
      e.job.set_eval_accuracy(*step.eval_accuracy);
      row.has_eval = true;
      row.eval_loss = *step.eval_loss;
      row.eval_accuracy = *step.eval_accuracy;
      jobs_.Event(e.job.id(), absl::StrFormat("held-out data before step %d: loss %.4f "
                                              "accuracy %.4f",
                                              step.step + 1, *step.eval_loss,
                                              *step.eval_accuracy));
    }
    e.unwritten_steps.push_back(row);
  }
}

absl::StatusOr<v1::ReportResponse> Coordinator::ReportStageEnd(const std::string& session,
                                                               const v1::StageEnd& end) {
  return LockedThenFlush(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::StatusOr<v1::ReportResponse> {
    PT_ASSIGN_OR_RETURN(WorkerPool::Worker * caller, CallerLocked(session, end.worker_id()));
    auto it = jobs_.find(end.job_id());
    if (it != jobs_.end() && end.generation() != 0 && end.generation() != it->second.job.generation()) {
      // An earlier generation's rank has ended: its worker is free (PlaceRecovering waits
      // for that); the job is not touched.
      if (caller->info.job_id() == end.job_id() && caller->generation == end.generation()) {
        pool_.Release(*caller);
      }
      Schedule();
      return v1::ReportResponse();
    }
    if (it != jobs_.end() && end.rank() >= 0 &&
        end.rank() < static_cast<int>(it->second.rank_worker.size()) &&
        it->second.rank_worker[end.rank()] != caller->info.id()) {
      return absl::PermissionDeniedError(absl::StrCat("job ", end.job_id(), " rank ", end.rank(),
                                                      " runs on ", it->second.rank_worker[end.rank()],
                                                      ", not ", caller->info.id()));
    }
    if (end.error().size() <= kMaxErrorBytes) return StageEndLocked(end);
    v1::StageEnd cut = end;  // a cause is kept to its first kMaxErrorBytes
    cut.set_error(absl::StrCat(end.error().substr(0, kMaxErrorBytes), "..."));
    return StageEndLocked(cut);
  });
}

absl::StatusOr<v1::ReportResponse> Coordinator::StageEndLocked(const v1::StageEnd& end) {
  v1::ReportResponse response;
  WorkerPool::Worker* w = pool_.Find(end.worker_id());
  auto it = jobs_.find(end.job_id());
  if (w != nullptr && w->info.job_id() == end.job_id() &&
      (it == jobs_.end() || w->generation == it->second.job.generation())) {
    pool_.Release(*w);
  }
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", end.job_id()));
  JobEntry& e = it->second;
  if (e.survivors && end.generation() == e.job.generation()) SurvivorStageEnd(e, end);
  StageEnded ended;
  ended.rank = end.rank();
  ended.ok = end.ok();
  ended.failed_after_peer = end.failed_after_peer();
  ended.failure = absl::StrCat(RankName(e.job, end.rank()), " on ", end.worker_id(), " failed: ",
                               end.error());
  ended.at = deps_.clock->Now();
  ApplyEvent(e, ended);
  Schedule();
  return response;
}

}  // namespace pipetrain::coordinator
