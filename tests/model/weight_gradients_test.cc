// Zero-bubble's split backward (runtime/model/weight_gradients.h) against the full backward.
//
// For every built-in model, whole (the GPT from its token ids) and from a float input with a
// gradient, in float32 (oneDNN's products where this machine has them) and float64
// (LibTorch's), with and without recomputation: a stage's I<0> I<1> W<0> W<1> (the order
// zero-bubble runs them in) leaves the same input gradients and parameter gradients, bit for
// bit, as B<0> B<1> of a stage that does not split. So does B through the generic path.
// Negative controls: after the I's alone no parameter has a gradient but the batch norms'
// (every other waits for W: the linear products' and, through the generic path, the layer
// norms', embeddings' and convolutions'), and without the generic path more do. A weight used twice
// on one path gets its two uses' gradients once each: the full backward's gradient, not twice it
// (the bug upstream split backwards had); in a TorchScript module too.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/model/dense_kernels.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "runtime/model/torchscript_model.h"
#include "runtime/model/weight_gradients.h"
#include "tests/model/builtin_configs.h"

namespace pipetrain::model {
namespace {

constexpr int64_t kBatch = 3;

// Layers [first, end) of `config` as a stage, recomputing all of them or none, its deferral
// splitting (the generic path recorded) or not. A GPT stage from layer 1 has a float input
// with a gradient; from layer 0, token ids.
struct Stage {
  std::unique_ptr<StageModule> module;
  int first = 0;
};

Stage BuildStage(const ModelConfig& config, int first, bool recompute, bool splits) {
  absl::StatusOr<LayerList> layers = BuildLayers(config, first, -1);
  EXPECT_TRUE(layers.ok()) << layers.status();
  const size_t n = layers.ok() ? layers->size() : 0;
  Stage stage{
      std::make_unique<StageModule>(first, *std::move(layers), std::vector<bool>(n, recompute)),
      first};
  stage.module->weight_gradients().set_splits(splits);
  return stage;
}

// Micro-batch j's input of the stage and the weights of its stand-in loss sum(output * r).
struct MicroBatch {
  at::Tensor input, loss_weights;
};

std::vector<MicroBatch> MicroBatches(const ModelConfig& config, const Stage& stage, int count) {
  torch::manual_seed(7);
  const at::ScalarType dtype = config.float64 ? at::kDouble : at::kFloat;
  std::vector<MicroBatch> out;
  for (int j = 0; j < count; ++j) {
    at::Tensor x = config.name == "gpt" && stage.first > 0
                       ? torch::randn({kBatch, config.seq_len, config.d_model})
                       : SampleInput(config, kBatch);
    if (x.is_floating_point()) x = x.to(dtype);
    LayerContext ctx;
    ctx.micro_batch = j;
    ctx.recomputing = true;  // a probe for the output's shape: no statistics recorded
    torch::NoGradGuard no_grad;
    const at::Tensor shape = stage.module->Forward(x, ctx);
    out.push_back({x, torch::randn(shape.sizes()).to(dtype)});
  }
  return out;
}

struct Gradients {
  std::vector<at::Tensor> inputs;      // of each micro-batch
  std::vector<at::Tensor> parameters;  // undefined where a parameter has none
};

Gradients Collect(const StageModule& module, const std::vector<at::Tensor>& inputs) {
  Gradients g;
  for (const at::Tensor& x : inputs) g.inputs.push_back(x.grad());
  for (const at::Tensor& p : module.Parameters()) g.parameters.push_back(p.grad());
  return g;
}

// The micro-batches' forwards; each output's loss, for its backward.
std::vector<at::Tensor> Forwards(StageModule& module, const std::vector<MicroBatch>& batches,
                                 std::vector<at::Tensor>* inputs) {
  std::vector<at::Tensor> losses;
  for (size_t j = 0; j < batches.size(); ++j) {
    at::Tensor x = batches[j].input.detach().clone();
    if (x.is_floating_point()) x.requires_grad_(true);
    inputs->push_back(x);
    LayerContext ctx;
    ctx.micro_batch = static_cast<int64_t>(j);
    losses.push_back((module.Forward(x, ctx) * batches[j].loss_weights).sum());
  }
  return losses;
}

Gradients FullBackward(StageModule& module, const std::vector<MicroBatch>& batches) {
  std::vector<at::Tensor> inputs;
  for (at::Tensor& loss : Forwards(module, batches, &inputs)) loss.backward();
  return Collect(module, inputs);
}

// I<j> for every micro-batch, then (with `run_w`) W<j> for every one.
Gradients IThenW(StageModule& module, const std::vector<MicroBatch>& batches, bool run_w,
                 size_t* deferred) {
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> losses = Forwards(module, batches, &inputs);
  std::vector<WeightGradientQueue> queues(batches.size());
  for (size_t j = 0; j < batches.size(); ++j) {
    DeferWeightGradients defer(module.weight_gradients(), queues[j]);
    losses[j].backward();
  }
  *deferred = queues[0].size();
  if (run_w) {
    for (WeightGradientQueue& q : queues) q.Run();
  }
  return Collect(module, inputs);
}

bool BitwiseEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined()) return false;
    if (a[i].defined() && !at::equal(a[i], b[i])) return false;
  }
  return true;
}

// Whether no parameter of `g` has a gradient.
bool NoParameterGradient(const Gradients& g) {
  for (const at::Tensor& p : g.parameters) {
    if (p.defined()) return false;
  }
  return true;
}

// Whether, after the I's, exactly the batch norms' parameters (a convolution layer's after its
// weight) have their gradients: they come with the input's gradient, and stay in I.
bool OnlyBatchNormsHaveGradients(const StageModule& module, const Gradients& g) {
  size_t i = 0;
  for (const auto& layer : module.layers()) {
    const bool conv = layer->name().rfind("conv", 0) == 0;
    const size_t n = layer->Parameters().size();
    for (size_t k = 0; k < n; ++k, ++i) {
      if (i >= g.parameters.size() || g.parameters[i].defined() != (conv && k > 0)) return false;
    }
  }
  return i == g.parameters.size();
}

TEST(SplitBackward, IThenWEqualsTheFullBackwardBitwiseForEveryBuiltinModel) {
  for (ModelConfig config : BuiltinConfigs()) {
    for (const int first : config.name == "gpt" ? std::vector<int>{0, 1} : std::vector<int>{0}) {
      for (const bool float64 : {false, true}) {
        for (const bool recompute : {false, true}) {
          config.float64 = float64;
          SCOPED_TRACE(config.name + " from layer " + std::to_string(first) +
                       (float64 ? " float64" : " float32") + (recompute ? " recomputed" : ""));
          Stage full = BuildStage(config, first, recompute, /*splits=*/false);
          const std::vector<MicroBatch> batches = MicroBatches(config, full, 2);
          const Gradients expected = FullBackward(*full.module, batches);
          // B through the generic path.
          Stage recorded = BuildStage(config, first, recompute, /*splits=*/true);
          const Gradients whole = FullBackward(*recorded.module, batches);
          EXPECT_TRUE(BitwiseEqual(whole.inputs, expected.inputs));
          EXPECT_TRUE(BitwiseEqual(whole.parameters, expected.parameters));

          Stage split = BuildStage(config, first, recompute, /*splits=*/true);
          size_t deferred = 0;
          const Gradients got = IThenW(*split.module, batches, /*run_w=*/true, &deferred);
          EXPECT_GT(deferred, 0u);
          EXPECT_TRUE(BitwiseEqual(got.inputs, expected.inputs));
          EXPECT_TRUE(BitwiseEqual(got.parameters, expected.parameters));
          // Negative control: after the I's alone every parameter but the batch norms' waits
          // for its W.
          Stage only_i = BuildStage(config, first, recompute, /*splits=*/true);
          const Gradients partial = IThenW(*only_i.module, batches, /*run_w=*/false, &deferred);
          EXPECT_TRUE(BitwiseEqual(partial.inputs, expected.inputs));
          EXPECT_TRUE(OnlyBatchNormsHaveGradients(*only_i.module, partial));
          EXPECT_FALSE(BitwiseEqual(partial.parameters, expected.parameters));
          // Without the generic path only the linear products wait: the mlp's parameters are
          // all theirs; every other model has norms, embeddings or convolutions.
          Stage linear_only = BuildStage(config, first, recompute, /*splits=*/false);
          const Gradients in_i = IThenW(*linear_only.module, batches, /*run_w=*/false, &deferred);
          EXPECT_EQ(NoParameterGradient(in_i), config.name == "mlp");
        }
      }
    }
  }
}

// y = W·tanh(W·x + b) + b: one weight and one bias used twice on the path.
class UsedTwice : public Layer {
 public:
  explicit UsedTwice(int64_t d)
      : weight_(torch::randn({d, d}, torch::kDouble).requires_grad_(true)),
        bias_(torch::randn({d}, torch::kDouble).requires_grad_(true)) {}
  std::string name() const override { return "used_twice"; }
  at::Tensor Forward(const at::Tensor& x, const LayerContext& ctx) override {
    const at::Tensor h = at::tanh(Linear(x, weight_, bias_, ctx.weight_gradients));
    return Linear(h, weight_, bias_, ctx.weight_gradients);
  }
  std::vector<at::Tensor> Parameters() const override { return {weight_, bias_}; }
  std::unique_ptr<Layer> Clone() const override {
    auto copy = std::make_unique<UsedTwice>(weight_.size(0));
    torch::NoGradGuard no_grad;
    copy->weight_.copy_(weight_);
    copy->bias_.copy_(bias_);
    return copy;
  }
  void ToDtype(at::ScalarType) override {}
  void ToDevice(at::Device) override {}
  void SetTraining(bool) override {}

 private:
  at::Tensor weight_, bias_;
};

TEST(SplitBackward, AWeightUsedTwiceOnOnePathGetsItsGradientOnce) {
  torch::manual_seed(3);
  LayerList layers;
  layers.push_back(std::make_unique<UsedTwice>(5));
  StageModule full(0, std::move(layers));
  std::unique_ptr<StageModule> split = full.Clone();
  const std::vector<MicroBatch> batches = {
      {torch::randn({4, 5}, torch::kDouble), torch::randn({4, 5}, torch::kDouble)}};
  const Gradients expected = FullBackward(full, batches);
  size_t deferred = 0;
  const Gradients got = IThenW(*split, batches, /*run_w=*/true, &deferred);
  EXPECT_EQ(deferred, 2u);  // one work item a use, each the weight's and the bias's share
  ASSERT_EQ(got.parameters.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(got.parameters[i].defined());
    // The two uses' gradients are summed in another order than autograd's buffer sums them.
    EXPECT_TRUE(torch::allclose(got.parameters[i], expected.parameters[i], 1e-14, 1e-14))
        << (got.parameters[i] - expected.parameters[i]).abs().max();
    // Not the gradient counted once per use (each use's W taking the whole gradient).
    EXPECT_FALSE(torch::allclose(got.parameters[i], 2 * expected.parameters[i], 1e-3, 1e-6));
  }
  EXPECT_TRUE(BitwiseEqual(got.inputs, expected.inputs));
}

// A TorchScript module on the generic path: a layer norm, then one weight used twice
// (w·tanh(w·h)); the module wrapped whole.
std::string SaveScriptedNormAndSharedWeight(const std::string& path) {
  torch::manual_seed(5);
  torch::jit::Module root("Sequential");
  root.register_attribute("training", c10::BoolType::get(), true);
  torch::jit::Module block("NormShared");
  block.register_attribute("training", c10::BoolType::get(), true);
  block.register_parameter("ln_w", torch::randn({6}, torch::kDouble), false);
  block.register_parameter("ln_b", torch::randn({6}, torch::kDouble), false);
  block.register_parameter("w", torch::randn({6, 6}, torch::kDouble) / 3, false);
  block.define(
      "def forward(self, x):\n"
      "  h = torch.layer_norm(x, [6], self.ln_w, self.ln_b, 1e-5, False)\n"
      "  return torch.matmul(torch.tanh(torch.matmul(h, self.w.t())), self.w.t())\n");
  root.register_module("0", block);
  root.save(path);
  return path;
}

TEST(SplitBackward, ATorchScriptModuleSplitsItsBackwardToo) {
  const std::string path =
      SaveScriptedNormAndSharedWeight(::testing::TempDir() + "/norm_shared.pt");
  auto build = [&](bool splits) {
    absl::StatusOr<LayerList> layers = LoadTorchScript(path);
    EXPECT_TRUE(layers.ok()) << layers.status();
    auto module = std::make_unique<StageModule>(0, *std::move(layers));
    module->weight_gradients().set_splits(splits);
    return module;
  };
  torch::manual_seed(11);
  const std::vector<MicroBatch> batches = {
      {torch::randn({4, 6}, torch::kDouble), torch::randn({4, 6}, torch::kDouble)},
      {torch::randn({4, 6}, torch::kDouble), torch::randn({4, 6}, torch::kDouble)}};
  const Gradients expected = FullBackward(*build(false), batches);
  size_t deferred = 0;
  const Gradients got = IThenW(*build(true), batches, /*run_w=*/true, &deferred);
  EXPECT_EQ(deferred, 1u);  // the module's parameters in one work item a micro-batch
  ASSERT_EQ(got.parameters.size(), 3u);
  EXPECT_TRUE(BitwiseEqual(got.inputs, expected.inputs));
  EXPECT_TRUE(BitwiseEqual(got.parameters, expected.parameters));
  // Not the shared weight's gradient counted once per use.
  EXPECT_FALSE(torch::allclose(got.parameters[2], 2 * expected.parameters[2], 1e-3, 1e-6));
  // Negative control: after the I's alone, every parameter waits for W.
  EXPECT_TRUE(NoParameterGradient(IThenW(*build(true), batches, /*run_w=*/false, &deferred)));
}

}  // namespace
}  // namespace pipetrain::model
