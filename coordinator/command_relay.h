// Step commands (flush, weight-version switch, checkpoint, stop at a named step) on their way
// to a running job. They go to the worker of rank 0 only: its stage passes them through the
// data plane to every other stage, and each rank's step report says when they took effect
// there. Three callers relay: a user's SendCommand, a draining worker's checkpoint and the
// checkpoint of every running job before the coordinator stops.
//
//   Rank0      where a command for a job goes now, or why it cannot go (not running,
//              recovering, rank 0's worker unknown or lost);
//   Send       the call itself (off the coordinator's lock: it is an RPC);
//   Count      each command asked for, by outcome, for /metrics.
// Each job's controller tallies its ranks' reports of the commands taking effect
// (job_controller.h).
//
// Not thread-safe: the coordinator calls Rank0 and Count under its lock, Send outside it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_machine.h"
#include "coordinator/worker_client.h"
#include "coordinator/worker_pool.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// "flush", "switch", "checkpoint", "stop": the names the CLI takes; "unknown" otherwise.
std::string StepCommandName(v1::StepCommand command);

class CommandRelay {
 public:
  // The client of rank 0's worker of `job` (phase `phase`, rank r on rank_worker[r]).
  // FailedPrecondition when the job does not run or recovers (its next generation is not
  // placed yet), Unavailable when rank 0's worker is not known or lost.
  static absl::StatusOr<std::shared_ptr<WorkerClient>> Rank0(
      const v1::Job& job, Phase phase, const std::vector<std::string>& rank_worker,
      WorkerPool& pool);
  // Schedules `command` on rank 0's worker (at `step`, 0: the earliest boundary); the
  // boundary it takes effect at. Never under the coordinator's lock.
  static absl::StatusOr<int64_t> Send(WorkerClient& rank0, const std::string& job_id,
                                      v1::StepCommand command, int64_t step = 0);

  void Count(v1::StepCommand command, const absl::Status& outcome);
  // (command name, "scheduled" or the refusal's status code) -> times asked.
  const std::map<std::pair<std::string, std::string>, int64_t>& counts() const { return counts_; }

 private:
  std::map<std::pair<std::string, std::string>, int64_t> counts_;
};

}  // namespace pipetrain::coordinator
