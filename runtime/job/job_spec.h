// A training job as the runtime reads it (docs/design.md section 8.2): pipetrain.v1.JobSpec
// (proto/pipetrain/v1/job_spec.proto), the one definition of a job. Its fields' defaults and
// numeric bounds are the schema's, so an unset field reads as its default here as in the
// coordinator, the workers and pipetrain-run; the default job trains the built-in GPT on the
// built-in corpus with 4 stages under PipeDream-2BW. The runtime includes the message's
// generated header (protobuf, never gRPC).
//
// The spec names some things by text (schedule, dtype, recompute, the optimizer's decay and
// no_decay kinds); the typed views below (ScheduleOf, PrecisionOf, ...) read them. ValidateJob
// checks everything before any stage is built and reports every violation at once, each with
// its field path; the views are for a spec it accepted (an unknown name throws
// std::invalid_argument). Everything here is a pure function of the spec: thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "pipetrain/v1/job_spec.pb.h"
#include "runtime/model/model_config.h"
#include "runtime/model/partition.h"
#include "runtime/model/pipeline_layout.h"
#include "runtime/schedule/schedule.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::job {

using JobSpec = ::pipetrain::v1::JobSpec;

// Which layers re-materialize their activations in backward (the spec's `recompute`).
struct RecomputeConfig {
  enum class Mode { kNone, kAll, kStages, kLayers };
  Mode mode = Mode::kNone;
  std::vector<int> indices;  // stage indices (kStages) or global layer indices (kLayers)
};

// "none" | "all" | "stages:0,1" | "layers:2,3,5".
absl::StatusOr<RecomputeConfig> ParseRecompute(const std::string& text);
std::string FormatRecompute(const RecomputeConfig& config);

// What a job computes in (the spec's `dtype`). kBFloat16 is mixed precision: layers compute
// in bfloat16 under LibTorch's autocast (norms, softmax and the loss stay float32),
// activations and gradients travel between stages as bfloat16, and the weights, their
// gradients and the optimizer's state are float32.
enum class Precision { kFloat32, kFloat64, kBFloat16 };

// "float32"/"float", "float64"/"double", "bfloat16"/"bf16"; anything else InvalidArgument.
absl::StatusOr<Precision> ParsePrecision(const std::string& text);
// "float32", "float64", "bfloat16".
const char* PrecisionName(Precision precision);

// ---- Typed views of a spec ValidateJob accepted.
schedule::ScheduleKind ScheduleOf(const JobSpec& spec);
Precision PrecisionOf(const JobSpec& spec);
RecomputeConfig RecomputeOf(const JobSpec& spec);
// The model library's config: the spec's model fields (image_shape 3, 16, 16 where none is
// given); the sizes that come from the data (vocabulary, sequence length) are the plan's.
model::ModelConfig ModelConfigOf(const JobSpec& spec);
// The optimizer library's config: name, hyper-parameters, learning-rate schedule, no_decay.
weights::OptimizerConfig OptimizerConfigOf(const JobSpec& spec);
// Each model stage's layers (p x v of them with chunks); empty: balanced by parameter count.
std::vector<model::LayerRange> StageRangesOf(const JobSpec& spec);
// The data kind, its default for the model applied (classification for mlp, cnn and vgg,
// synthetic otherwise).
std::string DataKindOf(const JobSpec& spec);

// ---- Writing the fields a view reads.
void SetSchedule(JobSpec& spec, schedule::ScheduleKind kind);
void SetPrecision(JobSpec& spec, Precision precision);
void SetRecompute(JobSpec& spec, const RecomputeConfig& recompute);
void SetStageRanges(JobSpec& spec, const std::vector<model::LayerRange>& ranges);

// p: the pipeline's ranks: `stages` where set, else the explicit stage ranges divided by the
// chunks a rank holds, else `stages`' default. Every reader of the depth asks this.
int PipelineStages(const JobSpec& spec);
// v: the model chunks each rank holds (virtual_stages, its default resolved; 1 for a
// schedule without chunks).
int VirtualStages(const JobSpec& spec);
// The schedule's parameters for this job over `steps` steps (kind, p, m, v).
schedule::ScheduleParams ScheduleParamsOf(const JobSpec& spec, int steps);
// The job's pipeline layout: its depth, replicas, micro-batching and its explicit stage
// ranges (none: balanced when the job is planned).
model::PipelineLayout PipelineLayoutOf(const JobSpec& spec);

// Every violation in one InvalidArgument "invalid job: v1; v2", each "field.path: message".
// Checks what can be checked without building the model: every name (schedule, dtype, ...),
// every bound (job_limits.h), the partition arithmetic, for a built-in model the partition
// against its layers (stage ranges that overlap, leave a gap, run out of order or past the
// last layer, an empty stage, more stages than layers) and recompute's layer indices, the
// layers named; for a TorchScript model the runner checks them once it is loaded
// (ValidatePartition). Opens no file.
absl::Status ValidateJob(const JobSpec& spec);
// `spec` itself where ValidateJob accepts it, else its verdict.
absl::StatusOr<JobSpec> Validated(JobSpec spec);

// Why the step commit (job::Generation::commit_steps, plan.h) cannot run for `spec` (its schedule),
// or "" when it can.
std::string CommitStepsRefusal(const JobSpec& spec);

// `spec` with every field it leaves unset set to its default (`stages` to PipelineStages):
// the job as it runs, every field shown.
JobSpec WithDefaults(const JobSpec& spec);
// WithDefaults(spec) as one line of JSON: the spec's field names in field order
// ("microbatches", "optimizer": {"lr": ...}), every integer a number, stage_ranges as
// [[begin, end], ...] (the job file's form). What a run prints with --dry-run and writes as
// its summary's "config", and what a checkpoint's manifest records of its job.
std::string JobToJson(const JobSpec& spec);
// The spec a JobToJson line (or protobuf's JSON mapping of the spec: integers as strings,
// ranges as {"begin", "end"}) describes; InvalidArgument naming what does not parse.
absl::StatusOr<JobSpec> JobFromJson(const std::string& json);

}  // namespace pipetrain::job
