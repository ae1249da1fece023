// Step commands relayed to rank 0's worker. See command_relay.h.
#include "coordinator/command_relay.h"

#include "absl/strings/str_cat.h"
#include "jobspec/step_commands.h"
#include "runtime/control/step_commands.h"

namespace pipetrain::coordinator {

std::string StepCommandName(v1::StepCommand command) {
  const uint32_t bit = jobspec::StepCommandBit(command);
  return bit != 0 ? control::StepCommandsName(bit) : std::string("unknown");
}

absl::StatusOr<std::shared_ptr<WorkerClient>> CommandRelay::Rank0(
    const v1::Job& job, Phase phase, const std::vector<std::string>& rank_worker,
    WorkerPool& pool) {
  if (job.state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.id(), " is not running (",
                                                      v1::JobState_Name(job.state()),
                                                      "): step commands go to running jobs"));
  }
  if (phase == Phase::kRecovering) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job.id(),
                     " is recovering from a fault (its next generation is not placed "
                     "yet): send the command once it runs again"));
  }
  const WorkerPool::Worker* w = pool.Find(rank_worker.empty() ? "" : rank_worker[0]);
  if (w == nullptr || w->info.state() == v1::WORKER_STATE_LOST) {
    return absl::UnavailableError(absl::StrCat("the worker of rank 0 of ", job.id(), " is ",
                                               w == nullptr ? "not known" : "lost"));
  }
  return w->client;
}

absl::StatusOr<int64_t> CommandRelay::Send(WorkerClient& rank0, const std::string& job_id,
                                           v1::StepCommand command, int64_t step) {
  v1::SendCommandRequest request;
  request.set_job_id(job_id);
  request.set_command(command);
  request.set_step(step);
  absl::StatusOr<v1::SendCommandResponse> response = rank0.ScheduleCommand(request);
  if (!response.ok()) return response.status();
  return response->step();
}

void CommandRelay::Count(v1::StepCommand command, const absl::Status& outcome) {
  ++counts_[{StepCommandName(command),
             outcome.ok() ? std::string("scheduled") : absl::StatusCodeToString(outcome.code())}];
}

}  // namespace pipetrain::coordinator
