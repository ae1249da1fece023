// The contents of one layer's checkpoint file, and a stage's weights split into them.
//
// A layer file is what Python's torch.save writes for a dict of tensors (torch::pickle_save),
// so plain torch.load reads it: {"param.K": the layer's K-th parameter, "buffer.K": its K-th
// buffer (BatchNorm statistics), "optim.K.NAME": the optimizer's state NAME of parameter K
// ("step", "exp_avg", "exp_avg_sq" for AdamW; "momentum_buffer" for SGD), and where the
// next mini-batch runs on an older version than these (2BW's W(N-1) at boundary N,
// WeightStore::StaleForNext) "stale_param.K" and "stale_buffer.K", that version's}.
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
  // The version the next mini-batch runs on, where older (2BW): as many as `parameters` and
  // `buffers`, or both empty.
  std::vector<at::Tensor> stale_parameters;
  std::vector<at::Tensor> stale_buffers;
};

std::string SerializeLayerState(const LayerState& state);
// DataLoss for bytes that are not such a dict (keys numbered 0 .. K-1 without gaps).
absl::StatusOr<LayerState> ParseLayerState(const std::string& bytes);

// The newest weights of a stage, layer by layer, with the optimizer's state (copies; a
// shared parameter's is empty: its owner's holds it), and StaleForNext()'s where it has one.
std::vector<LayerState> StageLayerStates(const weights::WeightStore& weights);

// Whether `states` (a stage's layers) carry a stale version: every layer's stale tensors
// match its own in number, and some layer has one.
bool HaveStaleVersion(const std::vector<LayerState>& states);
// Copies the stale version of `states` into `module` (checked as LoadLayerStates checks).
absl::Status LoadStaleLayerStates(const std::vector<LayerState>& states,
                                  model::StageModule* module);

// Copies `states` (one per layer of `module`, in order) into `module`'s parameters and
// buffers and returns the optimizer state by position in module->OwnParameters() (a shared
// parameter takes its owner's values, and its owner's state goes with the owner). Checks
// every count, shape and dtype first and changes nothing if one differs (InvalidArgument
// naming the global layer and the tensor).
absl::StatusOr<std::vector<weights::ParameterState>> LoadLayerStates(
    const std::vector<LayerState>& states, model::StageModule* module);

}  // namespace pipetrain::checkpoint
