// The reports of running ranks (CoordinatorService.ReportSteps, ReportStageEnd,
// ReportStopped): each checked to come from the worker that runs the rank, of the job's
// running generation, then handed to its job's controller (job_controller.h), whose effects
// are carried out; a stage's end frees its worker and lets the dispatcher place what waits.
//
// Thread-safe: each call takes the coordinator's lock and writes what it changed before it
// answers.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/dispatcher.h"
#include "pipetrain/v1/coordinator_service.pb.h"

namespace pipetrain::coordinator {

class ReportManager {
 public:
  // `state` and `dispatcher` (borrowed) outlive this.
  ReportManager(CoordinatorState& state, Dispatcher& dispatcher)
      : state_(state), dispatcher_(dispatcher) {}

  // A batch is checked whole before any of it is applied: each report is its rank's next step
  // (one already counted, resent after a lost reply, is skipped) and below the job's steps,
  // with finite, non-negative times; otherwise InvalidArgument and the job is untouched.
  // Every call names the session it came with and may speak only for its worker's ranks
  // (NotFound: register again; PermissionDenied: another worker's rank).
  absl::StatusOr<v1::ReportResponse> ReportSteps(const std::string& session,
                                                 const v1::StepReports& reports)
      ABSL_LOCKS_EXCLUDED(state_.mu);
  // A rank ended (its cause kept to its first JobController::kMaxErrorBytes).
  absl::StatusOr<v1::ReportResponse> ReportStageEnd(const std::string& session,
                                                    const v1::StageEnd& end)
      ABSL_LOCKS_EXCLUDED(state_.mu);
  // A rank of a generation with the step commit whose run failed says where its weights
  // stand (job_controller.h Stopped): the first report of a rank ends it for the job machine
  // (as a failed StageEnd would; its worker stays busy until its StageEnd), and the
  // generation's round answers: WAIT until every rank is accounted for (or three heartbeat
  // intervals after the generation ended), then GO_ON or ABANDON. A job not running, another
  // generation's rank, or a job without the commit: ABANDON.
  absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const std::string& session,
                                                        const v1::StoppedRank& stopped)
      ABSL_LOCKS_EXCLUDED(state_.mu);

 private:
  // Which reports of a batch to apply (resent ones left out), or why the batch is refused;
  // the late reports of a generation whose survivors decide are counted here.
  absl::StatusOr<std::vector<const v1::StepReport*>> CheckReports(const std::string& session,
                                                                  const v1::StepReports& reports)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  absl::StatusOr<v1::ReportResponse> ReportStep(const v1::StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);
  absl::StatusOr<v1::ReportResponse> StageEnd(const v1::StageEnd& end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  CoordinatorState& state_;
  Dispatcher& dispatcher_;
};

}  // namespace pipetrain::coordinator
