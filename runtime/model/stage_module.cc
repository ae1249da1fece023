#include "runtime/model/stage_module.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/model/mixed_precision.h"

namespace pipetrain::model {
namespace {

// Re-materialization of local layers [begin, end) of a StageModule, like PyTorch's
// reentrant checkpoint: forward keeps only the input; backward re-runs the forward with
// grad enabled (recomputing = true) and back-propagates through it, which accumulates the
// parameters' gradients and yields the input's gradient. `anchor` is an empty tensor that
// requires grad, so that the segment takes part in backward even when its input does not
// (token ids into the embedding).
struct RecomputeSegment : public torch::autograd::Function<RecomputeSegment> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& anchor, StageModule* stage, int64_t begin,
                            int64_t end, const LayerContext& layer_ctx) {
    (void)anchor;
    ctx->save_for_backward({input});
    ctx->saved_data["stage"] = reinterpret_cast<int64_t>(stage);
    ctx->saved_data["begin"] = begin;
    ctx->saved_data["end"] = end;
    ctx->saved_data["micro_batch"] = layer_ctx.micro_batch;
    ctx->saved_data["mini_batch"] = layer_ctx.mini_batch;
    ctx->saved_data["seed"] = static_cast<int64_t>(layer_ctx.seed);
    return stage->RunLayers(input, static_cast<int>(begin), static_cast<int>(end), layer_ctx);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* stage = reinterpret_cast<StageModule*>(ctx->saved_data["stage"].toInt());
    LayerContext layer_ctx;
    layer_ctx.micro_batch = ctx->saved_data["micro_batch"].toInt();
    layer_ctx.mini_batch = ctx->saved_data["mini_batch"].toInt();
    layer_ctx.seed = static_cast<uint64_t>(ctx->saved_data["seed"].toInt());
    layer_ctx.recomputing = true;
    at::Tensor input = ctx->get_saved_variables()[0].detach();
    const bool input_has_grad = input.is_floating_point();
    if (input_has_grad) input.requires_grad_(true);
    at::Tensor output;
    {
      at::AutoGradMode enable_grad(true);
      output = stage->RunLayers(input, static_cast<int>(ctx->saved_data["begin"].toInt()),
                                static_cast<int>(ctx->saved_data["end"].toInt()), layer_ctx);
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    return {input_has_grad ? input.grad() : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

StageModule::StageModule(int first_layer, LayerList layers, std::vector<bool> recompute)
    : first_layer_(first_layer), layers_(std::move(layers)), recompute_(std::move(recompute)) {
  recompute_.resize(layers_.size(), false);
}

bool StageModule::recomputes_anything() const {
  for (bool r : recompute_) {
    if (r) return true;
  }
  return false;
}

at::Tensor StageModule::RunLayers(const at::Tensor& input, int begin, int end, LayerContext ctx) {
  MixedPrecisionScope mixed(device_type_, compute_);
  ctx.weight_gradients = &weight_gradients_;
  at::Tensor x = input;
  // Under mixed precision activations arrive in bfloat16; the residual stream between the
  // layers is kept in the master weights' float32, as it is in one process.
  if (compute_ == at::kBFloat16 && x.scalar_type() == at::kBFloat16) x = x.to(at::kFloat);
  for (int i = begin; i < end; ++i) {
    ctx.global_layer = first_layer_ + i;
    x = layers_[i]->Forward(x, ctx);
  }
  return x;
}

at::Tensor StageModule::Forward(const at::Tensor& input, const LayerContext& ctx) {
  at::Tensor x = input;
  const int n = num_layers();
  int i = 0;
  while (i < n) {
    int j = i;
    while (j < n && recompute_[j] == recompute_[i]) ++j;
    if (recompute_[i] && at::GradMode::is_enabled()) {
      static thread_local at::Tensor anchor = at::empty({0}).requires_grad_(true);
      x = RecomputeSegment::apply(x, anchor, this, int64_t{i}, int64_t{j}, ctx);
    } else {
      x = RunLayers(x, i, j, ctx);
    }
    i = j;
  }
  return x;
}

std::vector<at::Tensor> StageModule::Parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& layer : layers_) {
    for (const at::Tensor& p : layer->Parameters()) out.push_back(p);
  }
  return out;
}

std::vector<ParameterKinds> StageModule::OwnParameterKinds() const {
  std::vector<ParameterKinds> out;
  size_t i = 0;     // in Parameters()
  size_t next = 0;  // in shared_
  for (const auto& layer : layers_) {
    for (ParameterKinds kinds : layer->ParameterKindsOf()) {
      if (next < shared_.size() && shared_[next].index == static_cast<int>(i)) {
        ++next;
      } else {
        const auto set = kinds_of_.find(static_cast<int>(i));
        out.push_back(set != kinds_of_.end() ? set->second : kinds);
      }
      ++i;
    }
  }
  return out;
}

std::vector<at::Tensor> StageModule::OwnParameters() const {
  std::vector<at::Tensor> all = Parameters();
  if (shared_.empty()) return all;
  std::vector<at::Tensor> out;
  size_t next = 0;  // in shared_
  for (size_t i = 0; i < all.size(); ++i) {
    if (next < shared_.size() && shared_[next].index == static_cast<int>(i)) {
      ++next;
      continue;
    }
    out.push_back(all[i]);
  }
  return out;
}

absl::Status StageModule::ShareParameter(int index, const at::Tensor& owner) {
  const std::vector<at::Tensor> all = Parameters();
  if (index < 0 || index >= static_cast<int>(all.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", index, " of a stage of ", all.size(), " parameters"));
  }
  if (IsShared(index)) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", index, " is shared already"));
  }
  at::Tensor param = all[static_cast<size_t>(index)];
  if (!param.sizes().equals(owner.sizes()) || param.scalar_type() != owner.scalar_type() ||
      param.device() != owner.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", index, " (", c10::str(param.sizes()), " ", param.scalar_type(), " on ",
        param.device().str(), ") cannot share the storage of ", c10::str(owner.sizes()), " ",
        owner.scalar_type(), " on ", owner.device().str()));
  }
  int owner_index = -1;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].is_same(owner)) owner_index = static_cast<int>(i);
  }
  if (owner_index == index || IsShared(owner_index)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", index, " cannot share a shared parameter or itself"));
  }
  param.set_data(owner);  // the storage of `owner`; `param` stays a leaf of its own
  Shared shared{index, owner_index, owner};
  const auto by_index = [](const Shared& a, const Shared& b) { return a.index < b.index; };
  shared_.insert(std::upper_bound(shared_.begin(), shared_.end(), shared, by_index),
                 std::move(shared));
  return absl::OkStatus();
}

bool StageModule::IsShared(int index) const {
  return std::any_of(shared_.begin(), shared_.end(),
                     [index](const Shared& s) { return s.index == index; });
}

void StageModule::FoldSharedGradients() {
  if (shared_.empty()) return;
  const std::vector<at::Tensor> all = Parameters();
  at::NoGradGuard no_grad;
  for (const Shared& s : shared_) {
    at::Tensor param = all[static_cast<size_t>(s.index)];
    if (!param.grad().defined()) continue;
    at::Tensor owner = s.owner;
    owner.mutable_grad() =
        owner.grad().defined() ? owner.grad() + param.grad() : param.grad().clone();
    param.mutable_grad() = at::Tensor();
  }
}

std::vector<at::Tensor> StageModule::Buffers() const {
  std::vector<at::Tensor> out;
  for (const auto& layer : layers_) {
    for (const at::Tensor& b : layer->Buffers()) out.push_back(b);
  }
  return out;
}

std::unique_ptr<StageModule> StageModule::Clone() const {
  LayerList copies;
  for (const auto& layer : layers_) copies.push_back(layer->Clone());
  auto copy = std::make_unique<StageModule>(first_layer_, std::move(copies), recompute_);
  copy->compute_ = compute_;
  copy->device_type_ = device_type_;
  copy->kinds_of_ = kinds_of_;
  const std::vector<at::Tensor> params = copy->Parameters();
  for (const Shared& s : shared_) {
    const at::Tensor& owner =
        s.owner_index >= 0 ? params[static_cast<size_t>(s.owner_index)] : s.owner;
    const absl::Status shared = copy->ShareParameter(s.index, owner);
    TORCH_CHECK(shared.ok(), "StageModule::Clone: ", std::string(shared.message()));
  }
  return copy;
}

void StageModule::SetTraining(bool training) {
  for (auto& layer : layers_) layer->SetTraining(training);
}

void StageModule::ToDevice(at::Device device) {
  for (auto& layer : layers_) layer->ToDevice(device);
  device_type_ = device.type();
}

void StageModule::CopyWeightsFrom(const StageModule& other) {
  at::NoGradGuard no_grad;
  // A shared parameter holds its owner's storage: copied through the owner.
  auto dst = OwnParameters(), src = other.OwnParameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  auto dst_b = Buffers(), src_b = other.Buffers();
  for (size_t i = 0; i < dst_b.size(); ++i) dst_b[i].copy_(src_b[i]);
}

void StageModule::ZeroGrad() {
  for (at::Tensor& p : Parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

void StageModule::FinishMiniBatch(int64_t mini_batch) {
  for (auto& layer : layers_) layer->FinishMiniBatch(mini_batch);
}

void StageModule::DiscardMiniBatch(int64_t mini_batch) {
  for (auto& layer : layers_) layer->DiscardMiniBatch(mini_batch);
}

}  // namespace pipetrain::model
