// Everything about a job that every stage agrees on, computed identically in every thread
// or process from the JobConfig alone: the data, the whole model built once from the seed,
// the partition, what to recompute, and the shapes that cross each stage boundary. And the
// construction of one stage's weights and executor configuration from it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/data/dataset.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/job/job_config.h"
#include "runtime/model/layer.h"
#include "runtime/model/partition.h"
#include "runtime/transport/transport.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {

struct JobPlan {
  std::unique_ptr<data::Dataset> dataset;
  std::unique_ptr<data::BatchSampler> sampler;
  model::ModelConfig model_config;  // with sizes taken from the data
  model::LayerList layers;          // the whole model, initialized from the seed
  std::vector<model::LayerRange> partition;
  std::vector<bool> recompute;  // per global layer
  at::ScalarType dtype = at::kFloat;
  // boundary[s]: what stage s receives (boundary[0]: the input), boundary[p]: the output.
  std::vector<transport::TensorSpec> boundary;

  int stages() const { return static_cast<int>(partition.size()); }
  std::vector<std::string> layer_names() const;
};

// Validates the job completely (the partition against the model's layers too).
absl::StatusOr<JobPlan> MakeJobPlan(const JobConfig& config);

// Inputs and targets of global micro-batch j of one replica's shard, as tensors.
// Thread-safe.
class MicroBatchReader {
 public:
  MicroBatchReader(const JobPlan& plan, int micro_batches, int replica = 0)
      : plan_(plan), micro_batches_(micro_batches), replica_(replica) {}
  at::Tensor Inputs(int64_t j) const;
  at::Tensor Targets(int64_t j) const;

 private:
  data::MicroBatch Read(int64_t j) const;
  const JobPlan& plan_;
  int micro_batches_;
  int replica_;
};

// One stage of the replica `reader` reads for, ready to run: its weights and its executor
// configuration (schedule, data sources for the first and last stage, expected message
// shapes, deadline, replica count). `reader` must outlive the executor.
struct StageParts {
  std::unique_ptr<weights::WeightStore> weights;
  executor::StageConfig config;
};
absl::StatusOr<StageParts> BuildStage(const JobConfig& config, const JobPlan& plan,
                                      const MicroBatchReader& reader, int stage);

// Intra-op threads per stage for this job on this machine.
int ThreadsPerStage(const JobConfig& config, int stages);

}  // namespace pipetrain::job
