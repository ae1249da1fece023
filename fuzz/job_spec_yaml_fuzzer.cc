// libFuzzer target: the job-spec YAML reader (jobspec/spec_yaml.h) and what follows it for
// an accepted spec (conversion to the runtime's JobSpec with every limit, and the text
// form the worker receives). Properties: never a crash, a hang or an empty error; an
// accepted spec's text form reads back as the same spec.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "jobspec/spec_text.h"
#include "jobspec/spec_yaml.h"
#include "runtime/job/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pipetrain::v1::JobSpec> spec = pipetrain::jobspec::JobSpecFromYaml(text);
  if (!spec.ok()) {
    if (spec.status().message().empty()) std::abort();  // a refusal always says why
    return 0;
  }
  absl::StatusOr<pipetrain::job::JobSpec> config = pipetrain::job::Validated(*spec);
  if (!config.ok() && config.status().message().empty()) std::abort();
  absl::StatusOr<pipetrain::v1::JobSpec> again =
      pipetrain::jobspec::JobSpecFromText(pipetrain::jobspec::JobSpecToText(*spec));
  if (!again.ok() || again->SerializeAsString() != spec->SerializeAsString()) std::abort();
  return 0;
}
