// Layer-by-layer measurement of a job's model, one window of layers at a time. See
// layer_profiling.h.
#include "runtime/profiler/layer_profiling.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "runtime/memory/tensor_memory.h"
#include "runtime/model/mixed_precision.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/weight_gradients.h"
#include "runtime/profiler/timing.h"
#include "runtime/weights/optimizer.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::profiler {
namespace {

int64_t Bytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

}  // namespace

absl::StatusOr<std::vector<planner::LayerProfile>> ProfileWindow(
    const job::JobSpec& config, const job::JobPlan& plan, int begin, int end,
    const at::Tensor& input, const at::Tensor& targets, const ProfileOptions& options,
    at::Tensor& next) {
  absl::StatusOr<model::LayerList> built = model::BuildLayers(plan.model_config, begin, end);
  if (!built.ok()) return built.status();
  const int n = end - begin;
  const bool ends_model = end == static_cast<int>(plan.layers.size());
  std::vector<planner::LayerProfile> out(n);
  std::vector<std::vector<at::Tensor>> params(n);
  std::vector<std::unique_ptr<weights::Optimizer>> optimizers(n);
  for (int i = 0; i < n; ++i) {
    model::Layer& l = *(*built)[i];
    out[i].name = l.name();
    params[i] = l.Parameters();
    for (const at::Tensor& p : params[i]) out[i].parameter_bytes += Bytes(p);
    if (params[i].empty()) continue;
    absl::StatusOr<std::unique_ptr<weights::Optimizer>> optimizer =
        weights::MakeOptimizer(job::OptimizerConfigOf(config));
    if (!optimizer.ok()) return optimizer.status();
    optimizers[i] = *std::move(optimizer);
  }
  std::vector<std::vector<double>> forward(n), backward(n), update(n), weight_gradient(n);
  // The layers get a deferral as a stage's do (their backward takes the same path); it
  // defers only in the split pass below.
  model::WeightGradientDeferral deferral;
  // Each layer's forward from the previous output (detached: each is timed alone).
  const auto layer_input = [&](int i, const std::vector<at::Tensor>& outputs) {
    at::Tensor x = i == 0 ? input : outputs[i - 1];
    if (at::isFloatingType(x.scalar_type()) && begin + i > 0) {
      x = x.detach().requires_grad_(true);
    }
    return x;
  };
  for (int round = 0; round < options.warmup + options.repeats; ++round) {
    const bool timed = round >= options.warmup;
    std::vector<at::Tensor> inputs(n), outputs(n);
    at::Tensor loss;
    for (int i = 0; i < n; ++i) {
      const at::Tensor x = layer_input(i, outputs);
      inputs[i] = x;
      model::LayerContext ctx;
      ctx.seed = config.seed();
      ctx.global_layer = begin + i;
      ctx.micro_batch = round;
      ctx.weight_gradients = &deferral;
      const bool last = ends_model && i + 1 == n;
      const int64_t before = memory::TensorBytesInUse();
      const auto t0 = std::chrono::steady_clock::now();
      {
        // A bfloat16 job's layers compute under autocast, as in its stages.
        model::MixedPrecisionScope mixed(c10::DeviceType::CPU, plan.compute_dtype);
        outputs[i] = (*built)[i]->Forward(x, ctx);
      }
      if (last) {
        loss = at::cross_entropy_loss(outputs[i].reshape({-1, outputs[i].size(-1)}),
                                      targets.reshape({-1}));
      }
      const auto t1 = std::chrono::steady_clock::now();
      const int64_t kept = memory::TensorBytesInUse() - before;
      if (!timed) continue;
      forward[i].push_back(Seconds(t0, t1));
      out[i].output_bytes = Bytes(outputs[i]);
      out[i].stash_bytes =
          std::max<int64_t>(0, kept - out[i].output_bytes - (last ? Bytes(loss) : 0));
    }
    if (!ends_model) next = outputs[n - 1].detach();
    at::Tensor grad = ends_model ? at::Tensor() : at::randn_like(outputs[n - 1]) * 1e-3;
    for (int i = n - 1; i >= 0; --i) {
      memory::ResetPeakTensorBytes();
      const int64_t before_backward = memory::TensorBytesInUse();
      const auto t0 = std::chrono::steady_clock::now();
      if (ends_model && i + 1 == n) {
        loss.backward();
        loss = at::Tensor();
      } else {
        outputs[i].backward(grad);
      }
      const auto t1 = std::chrono::steady_clock::now();
      // The gradients of the parameters exist after the first round, so this is what the
      // backward itself allocates (its input's gradient included).
      const int64_t working = memory::PeakTensorBytes() - before_backward;
      grad = inputs[i].requires_grad() ? inputs[i].grad() : at::Tensor();
      outputs[i] = at::Tensor();  // frees what the forward kept, as the stage does
      if (!timed) continue;
      backward[i].push_back(Seconds(t0, t1));
      out[i].working_bytes = std::max<int64_t>(0, working);
    }
    if (timed) {
      // The split backward (zero-bubble's I then W): the same forwards again, untimed, then
      // each layer's backward with its weight gradients queued, and the queue run: W's time.
      std::vector<at::Tensor> split_inputs(n), split_outputs(n);
      at::Tensor split_loss;
      deferral.set_splits(true);  // the generic path too, as a zero-bubble stage records it
      for (int i = 0; i < n; ++i) {
        split_inputs[i] = layer_input(i, split_outputs);
        model::LayerContext ctx;
        ctx.seed = config.seed();
        ctx.global_layer = begin + i;
        ctx.micro_batch = round;
        ctx.weight_gradients = &deferral;
        model::MixedPrecisionScope mixed(c10::DeviceType::CPU, plan.compute_dtype);
        split_outputs[i] = (*built)[i]->Forward(split_inputs[i], ctx);
        if (ends_model && i + 1 == n) {
          split_loss = at::cross_entropy_loss(
              split_outputs[i].reshape({-1, split_outputs[i].size(-1)}), targets.reshape({-1}));
        }
      }
      at::Tensor g = ends_model ? at::Tensor() : at::randn_like(split_outputs[n - 1]) * 1e-3;
      for (int i = n - 1; i >= 0; --i) {
        model::WeightGradientQueue queue;
        {
          model::DeferWeightGradients defer(deferral, queue);
          if (ends_model && i + 1 == n) {
            split_loss.backward();
            split_loss = at::Tensor();
          } else {
            split_outputs[i].backward(g);
          }
        }
        const bool deferred = !queue.empty();  // nothing deferred: no W
        const auto t0 = std::chrono::steady_clock::now();
        queue.Run();
        const auto t1 = std::chrono::steady_clock::now();
        weight_gradient[i].push_back(deferred ? Seconds(t0, t1) : 0.0);
        g = split_inputs[i].requires_grad() ? split_inputs[i].grad() : at::Tensor();
        split_outputs[i] = at::Tensor();
      }
      deferral.set_splits(false);
    }
    for (int i = 0; i < n; ++i) {
      if (!optimizers[i]) continue;
      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : params[i]) {
        grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
      }
      at::NoGradGuard no_grad;
      const int64_t before = memory::TensorBytesInUse();
      const auto t0 = std::chrono::steady_clock::now();
      const bool finite = weights::AllFinite(grads);
      optimizers[i]->Step(params[i], grads);
      const auto t1 = std::chrono::steady_clock::now();
      if (round == 0)
        out[i].optimizer_bytes = std::max<int64_t>(0, memory::TensorBytesInUse() - before);
      if (timed && finite) update[i].push_back(Seconds(t0, t1));
    }
  }
  for (int i = 0; i < n; ++i) {
    out[i].forward_s = Median(forward[i]);
    out[i].backward_s = Median(backward[i]);
    out[i].weight_gradient_s = std::min(Median(weight_gradient[i]), out[i].backward_s);
    out[i].optimizer_s = Median(update[i]);
  }
  return out;
}

std::vector<std::pair<int, int>> ProfileWindows(const job::JobPlan& plan, int64_t budget) {
  std::vector<std::pair<int, int>> windows;
  const int layers = static_cast<int>(plan.layers.size());
  const int64_t element = plan.dtype == at::kDouble ? 8 : 4;
  int begin = 0;
  int64_t bytes = 0;
  for (int l = 0; l < layers; ++l) {
    const int64_t layer_bytes = 4 * element * plan.layers[l].num_parameters;
    if (l > begin && bytes + layer_bytes > budget) {
      windows.emplace_back(begin, l);
      begin = l;
      bytes = 0;
    }
    bytes += layer_bytes;
  }
  windows.emplace_back(begin, layers);
  return windows;
}

}  // namespace pipetrain::profiler
