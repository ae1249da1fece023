// A model is an ordered list of Layers; a pipeline stage runs a contiguous range of them.
//
// A Layer owns its parameters (leaf tensors that require grad) and buffers (e.g. BatchNorm
// running statistics). Clone() deep-copies both, which is how a stage keeps two weight
// versions (PipeDream-2BW) and how the reference trainer gets the same initialization.
// Forward() must be a pure function of (input, parameters, LayerContext): any randomness
// (dropout) is derived from the context, so a recomputed forward replays the same mask and
// the result does not depend on how layers are split into stages.
// Not thread-safe: one stage thread uses a Layer at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "runtime/model/parameter_kind.h"

namespace pipetrain::model {

class WeightGradientDeferral;  // weight_gradients.h

struct LayerContext {
  // The micro-batch's place in the job's sequence of them, whatever the layout: replica r's
  // micro-batch j = t·m + i is number t·(w·m) + r·m + i (RandomSeedFor's key; the samples
  // it holds are those of that place).
  int64_t micro_batch = 0;
  int64_t mini_batch = 0;    // step t = j / m
  bool recomputing = false;  // true for the second forward of a re-materialized segment
  uint64_t seed = 0;         // the job's seed
  int global_layer = 0;      // index of this layer in the whole model
  // The stage's switch for deferring weight gradients (zero-bubble's W, weight_gradients.h),
  // which layers that can defer pass to their products; null outside a stage.
  WeightGradientDeferral* weight_gradients = nullptr;
};

// A seed unique to (job seed, micro-batch, layer): what random layers draw from.
uint64_t RandomSeedFor(const LayerContext& ctx);

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string name() const = 0;
  virtual at::Tensor Forward(const at::Tensor& input, const LayerContext& ctx) = 0;
  virtual std::vector<at::Tensor> Parameters() const = 0;
  // The kinds of Parameters()[i] (parameter_kind.h: what weight decay groups by); the default,
  // every one 0 (a weight), for a layer that names none.
  virtual std::vector<ParameterKinds> ParameterKindsOf() const {
    return std::vector<ParameterKinds>(Parameters().size(), 0);
  }
  virtual std::vector<at::Tensor> Buffers() const { return {}; }
  virtual std::unique_ptr<Layer> Clone() const = 0;
  // Converts parameters and buffers to `dtype` (float32 / float64).
  virtual void ToDtype(at::ScalarType dtype) = 0;
  // Moves parameters and buffers to `device` (CPU or a CUDA device).
  virtual void ToDevice(at::Device device) = 0;
  virtual void SetTraining(bool training) = 0;
  // Called once per mini-batch t on the weight version that is updated at its end:
  // BatchNorm folds the statistics accumulated over t's micro-batches into its running
  // statistics here (docs/design.md section 4.6).
  virtual void FinishMiniBatch(int64_t /*mini_batch*/) {}
  // Instead of FinishMiniBatch for a skipped step (non-finite gradients): the statistics of
  // t's micro-batches are dropped, the running statistics left as they were.
  virtual void DiscardMiniBatch(int64_t /*mini_batch*/) {}
  // True when the layer keeps per-mini-batch statistics (BatchNorm).
  virtual bool HasMiniBatchStatistics() const { return false; }
  // Clone() shares the per-mini-batch statistics between copies (the weight versions of one
  // stage see one stream of micro-batches); this gives the layer statistics of its own.
  virtual void UseOwnStatistics() {}
};

using LayerList = std::vector<std::unique_ptr<Layer>>;

// Independent deep copies of layers [begin, end) (own statistics): how stages and the
// reference trainer are cut from one initialized model.
LayerList CloneLayers(const LayerList& layers, int begin, int end);

}  // namespace pipetrain::model
