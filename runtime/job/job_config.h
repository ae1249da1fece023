// A training job: model, data, schedule, partition, optimizer, steps (docs/design.md section 8.2).
//
// JobConfig is plain data with defaults that train the built-in GPT on the built-in corpus
// with 4 stages under PipeDream-2BW. ValidateJobConfig checks everything before any stage
// is built and reports every violation at once, each with its field path. It is the runtime's
// plain-C++ form of the job spec, pipetrain.v1.JobSpec: jobspec/ reads the spec from YAML and
// flags and converts it to a JobConfig (the runtime includes no protobuf).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/model_config.h"
#include "runtime/model/partition.h"
#include "runtime/model/pipeline_layout.h"
#include "runtime/schedule/schedule.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::job {

struct DataConfig {
  // synthetic (Markov corpus with known entropy) | bytes (any file, vocab 256) |
  // uint16 (flat token file) | classification (synthetic features for mlp/cnn).
  // Empty: classification for mlp/cnn, synthetic otherwise.
  std::string kind;
  std::string path;        // bytes, uint16
  int64_t seq_len = 32;    // token data: T
  int64_t vocab = 64;      // synthetic: vocabulary; uint16: 0 infers max id + 1
  int64_t branching = 4;   // synthetic: successors per token
  int64_t num_tokens = 1 << 20;   // synthetic
  int64_t num_samples = 1 << 16;  // classification
  uint64_t seed = 1234;
};

// Which layers re-materialize their activations in backward.
struct RecomputeConfig {
  enum class Mode { kNone, kAll, kStages, kLayers };
  Mode mode = Mode::kNone;
  std::vector<int> indices;  // stage indices (kStages) or global layer indices (kLayers)
};

// "none" | "all" | "stages:0,1" | "layers:2,3,5".
absl::StatusOr<RecomputeConfig> ParseRecompute(const std::string& text);
std::string FormatRecompute(const RecomputeConfig& config);

// What a job computes in (the job spec's `dtype`). kBFloat16 is mixed precision: layers
// compute in bfloat16 under LibTorch's autocast (norms, softmax and the loss stay float32),
// activations and gradients travel between stages as bfloat16, and the weights, their
// gradients and the optimizer's state are float32.
enum class Precision { kFloat32, kFloat64, kBFloat16 };

struct JobConfig {
  std::string name;  // shown by `pipetrain list`; no effect on training
  model::ModelConfig model;
  DataConfig data;
  schedule::ScheduleKind schedule = schedule::ScheduleKind::kTwoBW;
  // p: the pipeline's ranks. A schedule that HoldsChunks cuts the model into
  // virtual_stages x p model stages, v on each rank (stage_ranges then gives all of them).
  int stages = 4;
  // v: model chunks a rank holds under a schedule that HoldsChunks; 0: the schedule's
  // default (schedule::DefaultVirtualStages: 2 for interleaved, zbv and dualpipev, 1 for
  // zb1p). Any other schedule holds one stage a rank (0 or 1 here).
  int virtual_stages = 0;
  // pipedream: PipeDream's vertical sync. Every stage runs micro-batch j, forward and
  // backward, on the weight version stage 0 ran it on (not on its own newest), the version
  // travelling with the activations; the updates still step each stage's newest version.
  bool vertical_sync = false;
  int replicas = 1;  // w: data-parallel copies of the pipeline, gradients averaged
  // Hippie: stage 0 averages its gradients bucket by bucket during its final backward.
  bool overlap_allreduce = true;
  int64_t bucket_kib = 4096;
  // Each model stage's layers (p x v of them with chunks); empty: balanced by parameter count.
  std::vector<model::LayerRange> stage_ranges;
  int micro_batches = 8;                        // m
  int micro_batch_size = 8;                     // b
  int steps = 300;
  weights::OptimizerConfig optimizer = {"adamw", 3e-3};
  RecomputeConfig recompute;
  uint64_t seed = 1;
  Precision precision = Precision::kFloat32;  // the spec's `dtype`
  // Where the stages compute: "cpu" or "cuda" (each rank on a GPU of its own: the worker's,
  // or stage processes round-robin over the visible GPUs; stages as threads share one).
  std::string device = "cpu";
  int threads_per_stage = 0;      // 0: available cores / stages, at least 1
  double recv_timeout_s = 120.0;  // deadline of every wait for a peer
  // When set, every rank writes its final parameters and buffers to
  // <weights_dir>/stage<RANK>.pt (rank = replica * stages + stage) where it runs.
  std::string weights_dir;
  // Checkpoints keyed by global layer (runtime/checkpoint): before every step N that is a
  // multiple of `every`, the weights W(N) and optimizer state go to dir/step-N/ (2BW: the
  // pipeline drains and switches to W(N) there, so one version is written).
  struct Checkpoint {
    std::string dir = "checkpoints";  // relative: where the run runs
    int64_t every = 0;  // 0: none
    int keep = 3;
  } checkpoint;
  // "" | "latest" (checkpoint.dir's newest complete checkpoint) | a directory: the job runs
  // from the checkpoint's step on its weights and optimizer state.
  std::string resume_from;
  // Evaluation on held-out data (docs/design.md section 4.7d): the last `split` of the
  // dataset's samples (at least one) are held out of training whenever split > 0; at every
  // boundary N that is a multiple of `every` (N <= steps), each replica runs `batches`
  // forward-only micro-batches of them (microbatch_size rows each, its own share) through
  // the pipeline on W(N), the weights after N updates, and their mean loss and accuracy are
  // reported. Training is the same, bit for bit, with and without it.
  struct Eval {
    int64_t every = 0;  // 0: none
    int batches = 1;    // micro-batches each replica evaluates
    double split = 0;   // the fraction of the samples held out (0: none)
  } eval;
  // Worker daemons: how often the coordinator restarts the job after a fault (a worker lost,
  // a rank failed) from its latest checkpoint on the workers that remain, before it fails.
  int max_restarts = 0;
  // The step commit (executor::StageConfig::commit_steps): no rank applies an update before
  // every rank of every replica holds its final gradient, so that the survivors of a lost
  // rank hold one consistent step (runtime/recovery/survivor_step.h). Set by the host that
  // recovers from survivors; not in the job spec.
  bool commit_steps = false;
  // A step whose loss or gradients are not finite is skipped on every rank (weights and
  // optimizer state unchanged); this many in a row fail the job.
  int nonfinite_limit = 3;
  // Steps skipped in a row right before the first this run takes (a generation that goes on
  // after a restart: they count toward nonfinite_limit). Set by the host; not in the spec.
  int skipped_in_a_row = 0;
  // `stages: auto`: schedule, stages, replicas, micro-batch size and count and recomputation
  // are chosen by `planner` (runtime/planner) for the workers there are, keeping the global
  // batch replicas x micro_batches x micro_batch_size. A job runs only once planned.
  bool auto_stages = false;
  std::string planner = "2bw";  // 2bw | pipedream | hippie
};

// Every violation in one InvalidArgument, "; "-separated, each "field.path: message". Checks what can be checked
// without building the model: for a built-in model that includes the partition against its
// layers (stage ranges that overlap, leave a gap, run out of order or past the last layer,
// an empty stage, more stages than layers) and recompute's layer indices, the layers named;
// for a TorchScript model the runner checks them once it is loaded (ValidatePartition).
absl::Status ValidateJobConfig(const JobConfig& config);
// Why the step commit (JobConfig::commit_steps) cannot run for `config` as it stands (its
// schedule, device and stages), or "" when it can; ValidateJobConfig refuses the first.
std::string CommitStepsRefusal(const JobConfig& config);


// The pipeline depth p (ranks per replica): the number of explicit stage ranges divided by
// the chunks a rank holds, else `stages`.
int PipelineStages(const JobConfig& config);
// v: the model chunks each rank holds (virtual_stages, its default resolved; 1 for a
// schedule without chunks).
int VirtualStages(const JobConfig& config);
// The schedule's parameters for this job over `steps` steps (kind, p, m, v).
schedule::ScheduleParams ScheduleParamsOf(const JobConfig& config, int steps);

// The job's pipeline layout: its depth, replicas, micro-batching and its explicit stage
// ranges (none: balanced when the job is planned).
model::PipelineLayout PipelineLayoutOf(const JobConfig& config);

// "float32"/"float", "float64"/"double", "bfloat16"/"bf16"; anything else InvalidArgument.
absl::StatusOr<Precision> ParsePrecision(const std::string& text);
// "float32", "float64", "bfloat16".
const char* PrecisionName(Precision precision);

// The data kind after applying the default for the model.
std::string EffectiveDataKind(const JobConfig& config);

// Every field of the job as one line of JSON, keyed and nested by the field paths of the
// job spec (pipetrain.v1.JobSpec, the YAML job file): "microbatches", "optimizer.lr",
// "model.path" (the TorchScript file), "timeout_s", "dtype" as its name, "stage_ranges" as
// [[begin, end], ...]. What a run prints with --dry-run and writes as its summary's "config".
std::string JobConfigToJson(const JobConfig& config);

}  // namespace pipetrain::job
