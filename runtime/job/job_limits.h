// The bounds of every numeric field of a job, each with its reason: one table, checked by
// ValidateJobConfig (so by the coordinator, every worker and pipetrain-run alike) and
// printed as docs/limits.md (tests/jobspec checks the file against this table). Numbers
// must also be finite. The job's name is at most kMaxNameBytes of printable UTF-8; a path
// at most kMaxPathBytes, without control characters.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace pipetrain::job {

struct JobConfig;

struct FieldLimit {
  const char* path;  // the field, as the job spec and JobConfigToJson name it
  double min;
  double max;
  const char* reason;
};

// Every numeric field's bounds, in the order of the spec.
const std::vector<FieldLimit>& JobFieldLimits();

inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;
// One worker (or thread) per rank, every rank listed in the job's status: stages x replicas.
inline constexpr double kMaxRanks = 4096;

// Every violation of the limits, "path: ...", one per field.
std::vector<std::string> LimitViolations(const JobConfig& config);

// docs/limits.md's table: one row per field, then the other limits.
std::string LimitsMarkdown();

}  // namespace pipetrain::job
