// The job spec as one line of protobuf text format: how `pipetrain run` hands a job to
// pipetrain-run, and pipetrain-run to its stage processes (on their command line, so it
// is visible in `ps`). Doubles keep every digit.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::jobspec {

std::string JobSpecToText(const v1::JobSpec& spec);
// InvalidArgument if `text` is not a JobSpec in text format.
absl::StatusOr<v1::JobSpec> JobSpecFromText(const std::string& text);

}  // namespace pipetrain::jobspec
