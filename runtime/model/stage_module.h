// The layers of one pipeline stage, with optional re-materialization (recomputation).
//
// Layers marked for recomputation are grouped into maximal runs of consecutive layers
// ("segments"). A segment's forward runs without keeping activations; only its input is
// kept, and its forward is re-run during backward with LayerContext::recomputing = true, so
// dropout replays the same mask and BatchNorm does not count the micro-batch twice.
// Gradients are bitwise identical with and without recomputation. A recomputed segment under
// a deferral (weight_gradients.h) is recomputed in I, and its queued weight gradients keep
// what they need of it until W.
//
// A tied parameter whose members are on one rank is one parameter there: ShareParameter
// gives a member the storage of another (its owner, in this module or another one of the
// rank), so both uses read one tensor and the optimizer steps it once, through the owner.
// Each use's gradient still accumulates into its own member; FoldSharedGradients adds a
// shared member's into its owner's before anyone reads them.
// Not thread-safe: owned and used by one stage thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "runtime/model/layer.h"
#include "runtime/model/weight_gradients.h"

namespace pipetrain::model {

class StageModule {
 public:
  // `first_layer` is the global index of layers[0]. `recompute[i]` marks local layer i;
  // an empty vector means no recomputation.
  StageModule(int first_layer, LayerList layers, std::vector<bool> recompute = {});

  // Mixed precision: every forward (and recomputation) of the layers runs in a
  // MixedPrecisionScope of `compute` (bfloat16: the parameters are float32 master weights)
  // for the device of the parameters; float32 (the default) or float64: as the parameters are.
  void SetComputeDtype(at::ScalarType compute) { compute_ = compute; }
  at::ScalarType compute_dtype() const { return compute_; }
  // Moves the parameters and buffers to `device` (before any optimizer state exists).
  void ToDevice(at::Device device);

  // Every layer in training mode (dropout, BatchNorm on the micro-batch's statistics: how
  // stages are built) or not (evaluation: no dropout, BatchNorm on its running statistics).
  void SetTraining(bool training);

  // The stage's output for `input`. ctx.global_layer is filled in per layer.
  at::Tensor Forward(const at::Tensor& input, const LayerContext& ctx);

  // Runs local layers [begin, end) with plain autograd (no recomputation).
  at::Tensor RunLayers(const at::Tensor& input, int begin, int end, LayerContext ctx);

  // Every layer's parameters, in layer order: the model's own list (reports, checkpoints).
  std::vector<at::Tensor> Parameters() const;
  // Those this module updates: Parameters() without the shared ones. The optimizer, the
  // replicas' averaging and a weight store's gradients go by this list.
  std::vector<at::Tensor> OwnParameters() const;
  // The kinds (Layer::ParameterKindsOf) of each of OwnParameters(), in its order: what the
  // optimizer's weight decay groups by (a shared parameter's owner is of its own kind).
  std::vector<ParameterKinds> OwnParameterKinds() const;
  // From now on Parameters()[index] is of `kinds`, whatever its layer says (a tie's member is
  // of its first member's kinds, which may be on another rank); Clone() keeps it.
  void SetParameterKinds(int index, ParameterKinds kinds) { kinds_of_[index] = kinds; }
  // From now on Parameters()[index] holds `owner`'s storage (same shape, dtype and device):
  // one parameter, which `owner`'s module updates. `owner` is a parameter of this module
  // (an earlier one) or of another module of the rank; Clone() shares again within the copy,
  // and keeps sharing with another module's owner, so a module that shares with another is
  // never cloned (only stores of one version hold such modules). Call after ToDevice().
  // InvalidArgument if the two differ or `index` is out of range or already shared.
  absl::Status ShareParameter(int index, const at::Tensor& owner);
  bool IsShared(int index) const;
  bool shares_parameters() const { return !shared_.empty(); }
  // Adds each shared parameter's gradient into its owner's (owner + shared, in that order)
  // and drops it: what the update and the replicas' averaging read. Idempotent until the
  // next backward.
  void FoldSharedGradients();
  std::vector<at::Tensor> Buffers() const;
  // Deep copy (parameters, buffers, recomputation marks) for another weight version of
  // this stage; BatchNorm statistics stay shared with this module (see Layer::Clone).
  std::unique_ptr<StageModule> Clone() const;
  // Copies parameter and buffer values (not gradients) from a module of the same layout.
  void CopyWeightsFrom(const StageModule& other);
  // Drops every parameter's gradient (shared ones' too).
  void ZeroGrad();
  void FinishMiniBatch(int64_t mini_batch);
  void DiscardMiniBatch(int64_t mini_batch);

  // The switch its layers consult for deferring weight gradients (weight_gradients.h): every
  // forward of this module hands it to its layers.
  WeightGradientDeferral& weight_gradients() { return weight_gradients_; }

  int first_layer() const { return first_layer_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const LayerList& layers() const { return layers_; }
  bool recomputes_anything() const;

 private:
  int first_layer_;
  LayerList layers_;
  std::vector<bool> recompute_;
  struct Shared {
    int index;        // in Parameters()
    int owner_index;  // the owner's in Parameters(), or -1: another module's
    at::Tensor owner;
  };
  std::vector<Shared> shared_;              // in increasing index
  std::map<int, ParameterKinds> kinds_of_;  // SetParameterKinds, by index in Parameters()
  at::ScalarType compute_ = at::kFloat;
  WeightGradientDeferral weight_gradients_;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;  // of the parameters (ToDevice)
};

}  // namespace pipetrain::model
