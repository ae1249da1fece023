// pipetrain.v1.JobSpec -> the runtime's JobConfig: the one conversion, used by the coordinator
// (to validate), the workers (to build their stage) and pipetrain-run. Unset fields take
// JobConfig's defaults; adding a field to the spec means adding it here (and the test in
// tests/jobspec walks the spec's fields, so one left out fails it).
//
// JobConfigFromSpec validates everything that needs no model and no data (every field's type
// and range, the partition arithmetic, the partition against a built-in model's layers,
// m >= p for 2BW) and returns every violation in one InvalidArgument, each "field.path: what
// is wrong". It opens no file and builds nothing (no LibTorch here): what needs the model or
// the data (a TorchScript file, a data file, a TorchScript model's layer count) is checked by
// the worker when it plans its stage, and fails the job naming the field.
#pragma once

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/job/job_config.h"

namespace pipetrain::jobspec {

absl::StatusOr<job::JobConfig> JobConfigFromSpec(const v1::JobSpec& spec);

// `spec` with the layout of `planned` (a plan applied to it, run/plan_command.h): schedule,
// stage ranges, replicas, micro-batch count and size, overlap and recomputation set, `stages:
// auto` cleared. What every rank of a planned job is given.
v1::JobSpec SpecWithLayoutOf(const v1::JobSpec& spec, const job::JobConfig& planned);

// `spec` to be planned anew (`pipetrain plan`, `profile`): `stages: auto`, its own layer
// ranges dropped (the plan replaces its layout, so they are not checked).
void MarkForPlanning(v1::JobSpec* spec);

}  // namespace pipetrain::jobspec
