// The bounds of every numeric field of a job, each with its reason: the `limit` options of
// proto/pipetrain/v1/job_spec.proto, checked by ValidateJob (so by the coordinator, every
// worker and pipetrain-run alike) and printed as docs/limits.md (tests/jobspec checks the file
// against them). Numbers must also be finite. The job's name is at most kMaxNameBytes of printable
// UTF-8; a path at most kMaxPathBytes, without control characters.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "pipetrain/v1/job_spec.pb.h"

namespace pipetrain::job {

struct FieldLimit {
  std::string path;  // the field, as the job spec (and JobToJson) names it: "optimizer.lr"
  double min;
  double max;
  std::string reason;
};

// Every numeric field's bounds, in the order of the spec (a message's fields where it is).
// Thread-safe.
const std::vector<FieldLimit>& JobFieldLimits();

inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxPathBytes = 4096;
// One worker (or thread) per rank, every rank listed in the job's status: stages x replicas.
inline constexpr double kMaxRanks = 4096;

// Every violation of the limits by `spec` of pipeline depth `stages`, "path: ...", one per
// field.
std::vector<std::string> LimitViolations(const v1::JobSpec& spec, int stages);

// docs/limits.md's table: one row per field, then the other limits.
std::string LimitsMarkdown();

}  // namespace pipetrain::job
