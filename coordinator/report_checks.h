// What a worker may say in a step report, checked before any of it is applied: finite,
// non-negative times and byte counts, a committed checkpoint only from a rank of replica 0
// as a bounded absolute path, where the job resumed from only from rank 0, bounded text
// without control characters. Pure functions of the report and the job's layout;
// thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "pipetrain/v1/coordinator_service.pb.h"

namespace pipetrain::coordinator {

// OK, or InvalidArgument beginning with `where` ("job J rank R") and naming the field.
// `stages`: the job's pipeline stages (ranks below it are replica 0's).
absl::Status CheckStepReportFields(const v1::StepReport& report, int stages,
                                   const std::string& where);

// Every byte is printable or above ASCII (no control characters).
bool WithoutControlCharacters(const std::string& text);

}  // namespace pipetrain::coordinator
