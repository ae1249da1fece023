// pipetrain.v1.JobSpec -> the runtime's JobConfig (the coordinator validates with it, workers build
// their stage from it), and v1.StepCommand <-> the runtime's step command bits.
//
// JobConfigFromSpec validates everything the coordinator can know before touching a worker
// (every field, and the partition against the model's layers) and returns every violation
// in one InvalidArgument, each "field.path: what is wrong".
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/job/job_config.h"

namespace pipetrain::proto {

absl::StatusOr<job::JobConfig> JobConfigFromSpec(const v1::JobSpec& spec);

// The control::StepCommand bit of `command`; 0 for UNSPECIFIED or an unknown value.
uint32_t StepCommandBit(v1::StepCommand command);
// Every command in a set of control::StepCommand bits, in the order of the enum.
std::vector<v1::StepCommand> StepCommandsOf(uint32_t bits);

}  // namespace pipetrain::proto
