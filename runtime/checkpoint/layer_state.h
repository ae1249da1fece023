// The contents of one layer's checkpoint file, and a stage's weights split into them.
//
// A layer file is what Python's torch.save writes for a dict of tensors (torch::pickle_save),
// so plain torch.load reads it: {"param.K": the layer's K-th parameter, "buffer.K": its K-th
// buffer (BatchNorm statistics), "optim.K.NAME": the optimizer's state NAME of parameter K
// ("step", "exp_avg", "exp_avg_sq" for AdamW; "momentum_buffer" for SGD)}.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "runtime/model/stage_module.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::checkpoint {

struct LayerState {
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
  std::vector<weights::ParameterState> optimizer;  // one per parameter (empty: no state yet)
};

std::string SerializeLayerState(const LayerState& state);
// DataLoss for bytes that are not such a dict (keys numbered 0 .. K-1 without gaps).
absl::StatusOr<LayerState> ParseLayerState(const std::string& bytes);

// The newest weights of a stage, layer by layer, with the optimizer's state (copies; a
// shared parameter's is empty: its owner's holds it).
std::vector<LayerState> StageLayerStates(const weights::WeightStore& weights);

// Copies `states` (one per layer of `module`, in order) into `module`'s parameters and
// buffers and returns the optimizer state by position in module->OwnParameters() (a shared
// parameter takes its owner's values, and its owner's state goes with the owner). Checks
// every count, shape and dtype first and changes nothing if one differs (InvalidArgument
// naming the global layer and the tensor).
absl::StatusOr<std::vector<weights::ParameterState>> LoadLayerStates(
    const std::vector<LayerState>& states, model::StageModule* module);

}  // namespace pipetrain::checkpoint
