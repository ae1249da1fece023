// pipetrain.v1.JobSpec -> the runtime's JobConfig (the coordinator validates with it, workers build
// their stage from it).
//
// JobConfigFromSpec validates everything the coordinator can know before touching a worker
// (every field, and the partition against the model's layers) and returns every violation
// in one InvalidArgument, each "field.path: what is wrong".
#pragma once

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/job/job_config.h"

namespace pipetrain::proto {

absl::StatusOr<job::JobConfig> JobConfigFromSpec(const v1::JobSpec& spec);

}  // namespace pipetrain::proto
