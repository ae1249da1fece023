// The one reader of job files: YAML (see examples/) -> pipetrain.v1.JobSpec, key for key, by
// reflection over the spec's fields (a new field is readable without code here). Unknown keys and
// values of the wrong type are reported all at once, each with its path. `stages` takes a
// count, "0:2,2:7" or [[0, 2], [2, 7]]. Semantic checks are the coordinator's.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::jobspec {

absl::StatusOr<v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text);
// NotFound if the file cannot be read.
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

// Sets the field at `path` ("model.d_model", "weights_dir"; "stages" takes a count or
// "0:2,2:7") from the text of one command-line value, read as the YAML reader reads that
// key's value (a list field takes "a,b,c"), replacing what was there. Each problem is
// appended to `errors` as "path: what is wrong".
void SetSpecField(const std::string& path, const std::string& text, v1::JobSpec* spec,
                  std::vector<std::string>* errors);

}  // namespace pipetrain::jobspec
