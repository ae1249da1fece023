// Everything about a job that every stage agrees on, computed identically in every thread
// or process from the JobSpec alone: the data, the model's layers (names and parameter
// counts, no tensors), the partition, what to recompute, and the shapes that cross each stage
// boundary. And the construction of one stage from it: a stage builds only its own layers
// (model::BuildLayers), so no rank ever holds the whole model.
//
// Built-in models are described without building anything (model_config.h: layer sizes and
// output shapes by formula). A TorchScript model is known only by loading it: MakeJobPlan
// loads the file, runs micro-batch 0 through it once for the boundary shapes and frees it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/data/dataset.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/job/job_spec.h"
#include "runtime/model/layer.h"
#include "runtime/model/partition.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/transport/transport.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {

struct JobPlan {
  std::unique_ptr<data::Dataset> dataset;
  // Over the training samples [0, train_samples) only.
  std::unique_ptr<data::BatchSampler> sampler;
  int64_t train_samples = 0;
  // The samples held out for evaluation (JobSpec::eval.split): [begin, begin + count), none
  // without a split. For token data one window lies between the two, so that no token of a
  // held-out window is in a training window.
  struct HeldOut {
    int64_t begin = 0;
    int64_t count = 0;
  } held_out;
  int eval_batches = 1;             // micro-batches each replica evaluates (JobSpec::eval.batches)
  int micro_batch_size = 1;         // b: rows of every micro-batch, evaluated ones too
  model::ModelConfig model_config;  // with sizes taken from the data
  std::vector<model::LayerInfo> layers;  // every layer's name and parameter count
  // Each model stage's layers: p of them, or p x v under a schedule that HoldsChunks.
  std::vector<model::LayerRange> partition;
  // Which of a pipeline's p ranks holds which model stage (one each without chunks).
  schedule::ChunkLayout layout;
  // The model's tied parameters (model::TiedParameters), by global layer.
  std::vector<model::TieGroup> ties;
  std::vector<bool> recompute;                // per global layer
  at::ScalarType dtype = at::kFloat;          // of the weights (and of float input data)
  at::ScalarType compute_dtype = at::kFloat;  // of the layers' work and the messages
  // boundary[s]: what model stage s receives (boundary[0]: the input), boundary[S]: the
  // output.
  std::vector<transport::TensorSpec> boundary;

  // S: the model stages (checkpoints deliver, and stage outcomes are kept, by model stage).
  int stages() const { return static_cast<int>(partition.size()); }
  // p: the ranks of one pipeline (rank = replica x p + this).
  int ranks() const { return layout.ranks; }
  std::vector<std::string> layer_names() const;
  int64_t num_parameters() const;
};

// Validates the job completely (the partition against the model's layers too); what needs
// the data or a model file (data.path, model.path) fails naming that field. A job with
// `stages: auto` is FailedPrecondition: it runs once planned (run/plan_command.h).
absl::StatusOr<JobPlan> MakeJobPlan(const JobSpec& config);

// Inputs and targets of global micro-batch j of one replica's shard, as tensors.
// Thread-safe.
class MicroBatchReader {
 public:
  MicroBatchReader(const JobPlan& plan, int micro_batches, int replica = 0)
      : plan_(plan), micro_batches_(micro_batches), replica_(replica) {}
  at::Tensor Inputs(int64_t j) const;
  at::Tensor Targets(int64_t j) const;
  // Evaluated micro-batch k (0 <= k < eval_batches) of this replica: the same rows at every
  // evaluation, replica r's the held-out samples from (r x eval_batches + k) x b on, in
  // order (wrapping around the held-out part). REQUIRES: plan.held_out.count > 0.
  at::Tensor EvalInputs(int64_t k) const;
  at::Tensor EvalTargets(int64_t k) const;
  int replica() const { return replica_; }

 private:
  data::MicroBatch Read(int64_t j) const;
  data::MicroBatch ReadEval(int64_t k) const;
  at::Tensor InputsOf(const data::MicroBatch& mb) const;
  const JobPlan& plan_;
  int micro_batches_;
  int replica_;
};

// One rank of the replica `reader` reads for (its place `stage` in the pipeline), ready to
// run: the weights of each model stage it holds and its executor configuration (schedule,
// data sources for the first and last stage, expected message shapes, deadline, replica
// count). `reader` must outlive the executor.
struct StageParts {
  // In model order: one, or v under a schedule that HoldsChunks.
  std::vector<std::unique_ptr<weights::WeightStore>> weights;
  std::vector<int> model_stages;  // the model stage of each
  executor::StageConfig config;
  int64_t parameter_bytes = 0;  // one version of the rank's parameters

  // The weights, for the executor.
  std::vector<weights::WeightStore*> weight_stores() const;
};
// How the host that starts one generation of a job runs it, beyond its spec: not a field of
// the spec (users never set it); the coordinator sends it with each rank's assignment.
struct Generation {
  // The coordinator's number of this generation (StageAssignment.generation); 0 without the
  // daemons. Names the checkpoint directories its ranks write (checkpoint::CheckpointWriters).
  int64_t number = 0;
  // The step commit (executor::StageConfig::commit_steps): no rank applies an update before
  // every rank of every replica holds its final gradient, so that the survivors of a lost
  // rank hold one consistent step (runtime/recovery/survivor_step.h). BuildStage refuses it
  // where CommitStepsRefusal says why it cannot run.
  bool commit_steps = false;
  // Steps skipped in a row right before the first this run takes (a generation that goes on
  // after a restart: they count toward the spec's nonfinite_limit).
  int skipped_in_a_row = 0;
};

// Where a rank starts: mini-batch 0 on its layers built from (seed, layer index), or a
// resumed job's first step on its layers' weights and optimizer state from a checkpoint.
struct StageStart {
  int64_t first_step = 0;
  // The layers of the rank's model stages, in model order (empty: fresh).
  std::vector<checkpoint::LayerState> layers;
  Generation generation;
};
// The rank's layers, weights, optimizer state and the micro-batches it reads live on
// `device`; its layers compute in plan.compute_dtype.
absl::StatusOr<StageParts> BuildStage(const JobSpec& config, const JobPlan& plan,
                                      const MicroBatchReader& reader, int stage,
                                      const StageStart& start = {},
                                      c10::Device device = c10::Device(c10::DeviceType::CPU));
// The layers of the model stages rank `stage` holds, in model order (ranges of `partition`).
std::vector<model::LayerRange> RankLayers(const JobPlan& plan, int stage);

// Intra-op threads per stage for this job on this machine.
int ThreadsPerStage(const JobSpec& config, int stages);

}  // namespace pipetrain::job
