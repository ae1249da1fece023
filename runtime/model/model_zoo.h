// Built-in models (model_config.h) and models brought from Python as TorchScript, built
// layer by layer: a rank builds only the layers of its stage.
//
// Layer i's initial parameters are drawn from a generator seeded by LayerInitSeed(seed, i),
// so they depend only on (seed, global layer index, model config): the same values whatever
// the partition, and BuildLayers(c, 0, n) is the whole model the reference trainer uses.
// Parameters are drawn in float32 and converted when the job is float64. The loss is
// cross-entropy of the last layer's output [.., classes] against integer targets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/layer.h"
#include "runtime/model/model_config.h"

namespace pipetrain::model {

// Builds layers [begin, end) of the model (end < 0: through the last layer) in float32 or
// float64 (config.float64), in training mode, and nothing else. A TorchScript file is loaded
// whole (TorchScript has no partial load) and every child outside the range is dropped. A
// missing or unreadable TorchScript file is InvalidArgument with the path and the reason; a
// range outside the model is InvalidArgument naming it. The file is opened without blocking,
// must be a regular file of at most kMaxModelFileBytes, and is read once.
inline constexpr int64_t kMaxModelFileBytes = int64_t{16} << 30;
absl::StatusOr<LayerList> BuildLayers(const ModelConfig& config, int begin, int end);

// Every layer: BuildLayers(config, 0, -1).
absl::StatusOr<LayerList> BuildModel(const ModelConfig& config);

// Number of parameters of each layer (a cost proxy for the default partition).
std::vector<double> ParameterCounts(const LayerList& layers);

}  // namespace pipetrain::model
