// The coordinator's JobService (coordinator.h): submission (planned at submission for
// `stages: auto`, its checkpoint directory placed, durable before it is acknowledged),
// queries and paging, waiting for a change, events and committed steps, cancel, step
// commands relayed to rank 0's worker (counted for /metrics), the checkpoint of every
// running job before the coordinator stops, and the jobs loaded back when it starts.
//
// Thread-safe: each call takes the coordinator's lock as it needs it, never across a call to
// a worker or a plan; what a caller is shown is in the store before the answer leaves.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/command_relay.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/dispatcher.h"
#include "coordinator/submission_planner.h"
#include "pipetrain/v1/job_service.pb.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::coordinator {

class JobManager {
 public:
  // `state` and `dispatcher` (borrowed) outlive this.
  JobManager(CoordinatorState& state, Dispatcher& dispatcher);

  // Loads every job of the store into its controller (JobController::FromRecord: a job
  // that ran restarts, or is marked interrupted). Once, before anything else.
  absl::Status Load() ABSL_LOCKS_EXCLUDED(state_.mu);

  // A spec with `stages: auto` is planned here with `model_profile_json` (the
  // model's profile, runtime/planner/profile_json.h) for the workers registered now (idle or
  // busy; their count, the smallest registered memory, the cores they share when all run on
  // one host); the job keeps the planned layout in its spec and the plan in `plan`.
  // InvalidArgument for a missing or bad profile, FailedPrecondition with no worker,
  // ResourceExhausted when no layout fits ("does not fit: needs X bytes on stage s, have Y").
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec,
                                 const std::string& model_profile_json = "");
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // Jobs oldest first, a page at a time: at most `page_size` (0: 100; at most 500) and about
  // kListPageBytes, after the job `page_token` names ("" from the first). The page's
  // next_page_token is "" after the last job; an invalid token is InvalidArgument.
  absl::StatusOr<v1::ListJobsResponse> List(int page_size = 0, const std::string& page_token = "");
  static constexpr size_t kListPageBytes = size_t{1} << 20;
  absl::StatusOr<v1::Job> Cancel(const std::string& id);
  // Waits until job `id` differs from `version` (or `deadline`); returns it and its version.
  absl::StatusOr<std::pair<v1::Job, int64_t>> WaitForChange(const std::string& id, int64_t version,
                                                            absl::Time deadline);
  // At most kEventsPerCall events after `after_seq` (a caller wanting more asks again).
  absl::StatusOr<std::vector<v1::JobEvent>> Events(const std::string& id, int64_t after_seq);
  static constexpr int64_t kEventsPerCall = 1000;
  // The committed steps of job `id` after `after_step`, at most kStepsPerCall.
  absl::StatusOr<std::vector<StoredStep>> Steps(const std::string& id, int64_t after_step);
  static constexpr int64_t kStepsPerCall = 10000;
  // Passes a step command to the worker of rank 0 (it reaches every stage through the data
  // plane) and returns the boundary it takes effect at.
  absl::StatusOr<v1::SendCommandResponse> SendCommand(const v1::SendCommandRequest& request);

  // Before the coordinator stops (SIGTERM): every running job with restarts left gets a
  // checkpoint at its earliest boundary; waits until each is the job's restart point (or
  // the job ended), at most `limit`. A restarted coordinator resumes the jobs from there.
  // Returns how many jobs got one in time.
  int CheckpointRunningJobs(absl::Duration limit);

  // Step commands asked for, by (command, outcome): for /metrics. Under the lock.
  const std::map<std::pair<std::string, std::string>, int64_t>& command_counts() const;

 private:
  absl::StatusOr<v1::SendCommandResponse> SendCommandUncounted(
      const v1::SendCommandRequest& request);
  // List's page of jobs after submission order `after`, at most `limit`.
  v1::ListJobsResponse ListPage(int64_t after, int limit) ABSL_LOCKS_EXCLUDED(state_.mu);
  // A job's checkpoints never share a directory with another's: without checkpoint.dir, job
  // `id` gets checkpoints/<id> (set in `spec` and `config`); a directory a queued or running
  // job uses is refused (FailedPrecondition naming that job), and so is resume_from: latest
  // without a directory (InvalidArgument: nothing is in a new one).
  absl::Status PlaceCheckpointDir(const std::string& id, v1::JobSpec& spec,
                                  job::JobSpec& config) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_.mu);

  CoordinatorState& state_;
  Dispatcher& dispatcher_;
  SubmissionPlanner planner_;  // `stages: auto` at submission; never under the lock
  CommandRelay commands_ ABSL_GUARDED_BY(state_.mu);  // step commands' counts
};

}  // namespace pipetrain::coordinator
