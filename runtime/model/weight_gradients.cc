#include "runtime/model/weight_gradients.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace pipetrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using OperationFn = std::function<at::Tensor(const at::Tensor&)>;

// GenericSplit's gradients: the input's (undefined: none); none for its other four inputs.
variable_list InputGradientOnly(at::Tensor input_grad) {
  return {std::move(input_grad), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

// SplitBackward's node. Its forward records fn's own graph from a detached copy of the input
// (a leaf of that graph) and keeps it; `anchor` (an empty tensor that requires grad) puts the
// node in the backward even when the input has no gradient (token ids).
struct GenericSplit : public torch::autograd::Function<GenericSplit> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& anchor,
                            WeightGradientDeferral* deferral,
                            const std::vector<at::Tensor>* parameters, const OperationFn* fn) {
    (void)anchor;
    at::Tensor leaf = input.detach();
    if (input.requires_grad() && input.is_floating_point()) leaf.requires_grad_(true);
    at::Tensor output;
    {
      torch::autograd::AutoGradMode enable_grad(true);
      output = (*fn)(leaf);
    }
    ctx->saved_data["input"] = leaf;
    ctx->saved_data["output"] = output;
    ctx->saved_data["parameters"] = *parameters;
    ctx->saved_data["deferral"] = reinterpret_cast<int64_t>(deferral);
    // The node's output: the same values under a history of its own (fn's graph stays
    // with `output`).
    return output.detach();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor input = ctx->saved_data["input"].toTensor();
    const at::Tensor output = ctx->saved_data["output"].toTensor();
    std::vector<at::Tensor> parameters = ctx->saved_data["parameters"].toTensorVector();
    auto* deferral = reinterpret_cast<WeightGradientDeferral*>(ctx->saved_data["deferral"].toInt());
    ctx->saved_data.clear();  // what W needs, its work holds
    const at::Tensor output_grad = grad_outputs[0];
    at::Tensor input_grad;
    if (!output.requires_grad()) return InputGradientOnly(input_grad);
    WeightGradientQueue* queue = deferral->queue();
    if (queue == nullptr) {
      // B: fn's backward as it is, accumulating into the parameters and the input's leaf.
      torch::autograd::backward({output}, {output_grad});
      return InputGradientOnly(input.requires_grad() ? input.grad() : at::Tensor());
    }
    if (input.requires_grad()) {
      input_grad = torch::autograd::grad({output}, {input}, {output_grad}, /*retain_graph=*/true,
                                         /*create_graph=*/false, /*allow_unused=*/true)[0];
    }
    // Each parameter once (a module may list a shared one twice): its uses' gradients are
    // summed by autograd.
    std::vector<at::Tensor> trained;
    for (const at::Tensor& p : parameters) {
      bool listed = false;
      for (const at::Tensor& q : trained) listed = listed || q.is_same(p);
      if (p.requires_grad() && !listed) trained.push_back(p);
    }
    if (!trained.empty()) {
      queue->Defer([output, output_grad, trained = std::move(trained)] {
        const variable_list grads =
            torch::autograd::grad({output}, trained, {output_grad}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t i = 0; i < trained.size(); ++i) {
          if (grads[i].defined()) AccumulateGradient(trained[i], grads[i]);
        }
      });
    }
    return InputGradientOnly(input_grad);
  }
};

}  // namespace

void WeightGradientQueue::Run() {
  // As the engine runs a backward: no graph is recorded for the gradients.
  torch::autograd::AutoGradMode no_grad(false);
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  for (std::function<void()>& w : work) w();
}

at::Tensor SplitBackward(const at::Tensor& input, const std::vector<at::Tensor>& parameters,
                         WeightGradientDeferral* deferral, const OperationFn& fn) {
  if (deferral == nullptr || !deferral->splits() || !torch::autograd::GradMode::is_enabled()) {
    return fn(input);
  }
  static thread_local const at::Tensor anchor = at::empty({0}).requires_grad_(true);
  return GenericSplit::apply(input, anchor, deferral, &parameters, &fn);
}

void AccumulateGradient(const at::Tensor& parameter, at::Tensor gradient) {
  at::Tensor& grad = parameter.mutable_grad();
  // The engine's own accumulation, so that the bits are the same as a full backward's.
  torch::autograd::AccumulateGrad::accumulateGrad(
      parameter, grad, gradient, /*num_expected_refs=*/1,
      [&grad](at::Tensor&& updated) { grad = std::move(updated); });
}

}  // namespace pipetrain::model
