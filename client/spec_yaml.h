// A YAML job file (see examples/) -> pipetrain.v1.JobSpec, key for key. Unknown keys and
// values of the wrong type are reported all at once, each with its path. `stages` takes a
// count, "0:2,2:7" or [[0, 2], [2, 7]]. Semantic checks are the coordinator's.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

absl::StatusOr<v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text);
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

}  // namespace pipetrain::client
