// Building a model's layers: a range of a built-in model's (builtin_layers.h) or of a
// TorchScript file's (torchscript_model.h), in the job's dtype and in training mode; and the
// helpers every Layer shares (its random seed, clones with statistics of their own).
#include "runtime/model/model_zoo.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "runtime/base/hash.h"
#include "runtime/base/status_macros.h"
#include "runtime/model/builtin_layers.h"
#include "runtime/model/torchscript_model.h"

namespace pipetrain::model {

uint64_t RandomSeedFor(const LayerContext& ctx) {
  uint64_t h = Mix64(ctx.seed);
  h = Mix64(h ^ static_cast<uint64_t>(ctx.micro_batch));
  return Mix64(h ^ (static_cast<uint64_t>(ctx.global_layer) << 32));
}

LayerList CloneLayers(const LayerList& layers, int begin, int end) {
  LayerList out;
  for (int i = begin; i < end; ++i) {
    out.push_back(layers[i]->Clone());
    out.back()->UseOwnStatistics();
  }
  return out;
}

namespace {

absl::Status CheckRange(int begin, int end, int n) {
  if (begin < 0 || begin > end || end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers [", begin, ", ", end, ") are not within the model's ", n, " layers"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LayerList> BuildLayers(const ModelConfig& c, int begin, int end) {
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  LayerList layers;
  try {
    if (c.name == "torchscript") {
      PT_ASSIGN_OR_RETURN(LayerList all, LoadTorchScript(c.torchscript_path));
      const int n = static_cast<int>(all.size());
      if (end < 0) end = n;
      PT_RETURN_IF_ERROR(CheckRange(begin, end, n));
      for (int i = begin; i < end; ++i) layers.push_back(std::move(all[i]));
    } else {
      PT_ASSIGN_OR_RETURN(std::vector<LayerInfo> info, BuiltinLayers(c));
      const int n = static_cast<int>(info.size());
      if (end < 0) end = n;
      PT_RETURN_IF_ERROR(CheckRange(begin, end, n));
      for (int i = begin; i < end; ++i) layers.push_back(BuildBuiltinLayer(c, i));
    }
    for (auto& layer : layers) {
      layer->ToDtype(c.float64 ? at::kDouble : at::kFloat);
      layer->SetTraining(true);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building model '", c.name, "': ", e.what()));
  }
  return layers;
}

absl::StatusOr<LayerList> BuildModel(const ModelConfig& c) { return BuildLayers(c, 0, -1); }

std::vector<double> ParameterCounts(const LayerList& layers) {
  std::vector<double> counts;
  for (const auto& layer : layers) {
    double n = 0;
    for (const at::Tensor& p : layer->Parameters()) n += static_cast<double>(p.numel());
    counts.push_back(n);
  }
  return counts;
}

}  // namespace pipetrain::model
