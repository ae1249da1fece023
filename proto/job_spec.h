// pipetrain.v1.JobSpec -> the runtime's JobConfig (the coordinator validates with it, workers build
// their stage from it), and v1.StepCommand <-> the runtime's step command bits.
//
// JobConfigFromSpec validates everything that needs no model and no data (every field's type
// and range, the partition arithmetic, the partition against a built-in model's layers,
// m >= p for 2BW) and returns every violation in one InvalidArgument, each "field.path: what
// is wrong". It opens no file and builds nothing (no LibTorch here): what needs the model or
// the data (a TorchScript file, a data file, a TorchScript model's layer count) is checked by
// the worker when it plans its stage, and fails the job naming the field.
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
