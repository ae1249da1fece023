// The layers of the built-in models: GPT (embedding, pre-LN blocks, final norm, head), MLP,
// CNN and VGG (convolution + micro-batch BatchNorm + ReLU, pooled classifier), their
// parameter initialization and their seeded dropout. See builtin_layers.h.
#include "runtime/model/builtin_layers.h"

#include <cmath>
#include <map>
#include <mutex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/hash.h"
#include "runtime/model/dense_kernels.h"
#include "runtime/model/weight_gradients.h"

namespace pipetrain::model {
namespace {

// Inverted dropout with a mask drawn from a generator seeded by (context, site): the same
// micro-batch through the same layer always gets the same mask.
at::Tensor Dropout(const at::Tensor& x, double p, const LayerContext& ctx, int site,
                   bool training) {
  if (!training || p <= 0.0) return x;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(
      Mix64(RandomSeedFor(ctx) ^ static_cast<uint64_t>(site)));
  at::Tensor mask = at::empty(x.sizes(), x.options().device(at::kCPU).requires_grad(false));
  mask.bernoulli_(1.0 - p, gen);
  mask.div_(1.0 - p);
  return x * mask.to(x.device());
}

// The generator that initial parameters are drawn from while BuildLayers builds a layer
// (seeded by LayerInitSeed); outside that (a Clone's reset(), whose values are overwritten
// by the copy) the process-wide one.
thread_local at::Generator* init_generator = nullptr;

class InitGeneratorScope {
 public:
  explicit InitGeneratorScope(uint64_t seed)
      : generator_(at::make_generator<at::CPUGeneratorImpl>(seed)) {
    init_generator = &generator_;
  }
  ~InitGeneratorScope() { init_generator = nullptr; }

 private:
  at::Generator generator_;
};

at::Tensor Normal(at::IntArrayRef shape, double std) {
  at::Tensor x = init_generator ? at::randn(shape, *init_generator) : at::randn(shape);
  return x * std;
}
at::Tensor Uniform(at::IntArrayRef shape, double bound) {
  at::Tensor x = init_generator ? at::rand(shape, *init_generator) : at::rand(shape);
  return x * (2 * bound) - bound;
}

// Adapts a torch::nn::Cloneable module with forward(Tensor, LayerContext) to Layer.
template <typename Impl>
class NnLayer : public Layer {
 public:
  NnLayer(std::string name, std::shared_ptr<Impl> impl, std::vector<ParameterKinds> kinds)
      : name_(std::move(name)), impl_(std::move(impl)), kinds_(std::move(kinds)) {}
  std::string name() const override { return name_; }
  at::Tensor Forward(const at::Tensor& input, const LayerContext& ctx) override {
    return impl_->forward(input, ctx);
  }
  std::vector<at::Tensor> Parameters() const override { return impl_->parameters(); }
  std::vector<ParameterKinds> ParameterKindsOf() const override { return kinds_; }
  std::vector<at::Tensor> Buffers() const override { return impl_->buffers(); }
  std::unique_ptr<Layer> Clone() const override {
    return std::make_unique<NnLayer<Impl>>(name_, std::dynamic_pointer_cast<Impl>(impl_->clone()),
                                           kinds_);
  }
  void ToDtype(at::ScalarType dtype) override { impl_->to(dtype); }
  void ToDevice(at::Device device) override { impl_->to(device); }
  void SetTraining(bool training) override { impl_->train(training); }
  void FinishMiniBatch(int64_t mini_batch) override { impl_->finish_mini_batch(mini_batch); }
  void DiscardMiniBatch(int64_t mini_batch) override { impl_->discard_mini_batch(mini_batch); }
  bool HasMiniBatchStatistics() const override { return impl_->has_mini_batch_statistics(); }
  void UseOwnStatistics() override { impl_->use_own_statistics(); }

 private:
  std::string name_;
  std::shared_ptr<Impl> impl_;
  std::vector<ParameterKinds> kinds_;  // BuiltinParameterKinds
};

// Default no-op hooks for modules without mini-batch statistics.
template <typename Derived>
struct StatelessModule : torch::nn::Cloneable<Derived> {
  void finish_mini_batch(int64_t) {}
  void discard_mini_batch(int64_t) {}
  bool has_mini_batch_statistics() const { return false; }
  void use_own_statistics() {}
};

// ---------------------------------------------------------------- GPT

struct GptEmbeddingImpl : StatelessModule<GptEmbeddingImpl> {
  GptEmbeddingImpl(int64_t vocab, int64_t seq_len, int64_t d, double dropout)
      : vocab(vocab), seq_len(seq_len), d(d), dropout(dropout) {
    reset();
  }
  void reset() override {
    token = register_parameter("token", Normal({vocab, d}, 0.02));
    position = register_parameter("position", Normal({seq_len, d}, 0.02));
  }
  at::Tensor forward(const at::Tensor& ids, const LayerContext& ctx) {
    const int64_t t = ids.size(1);
    at::Tensor x = SplitBackward(
        ids, {token, position}, ctx.weight_gradients,
        [&](const at::Tensor& in) { return at::embedding(token, in) + position.narrow(0, 0, t); });
    return Dropout(x, dropout, ctx, 0, is_training());
  }
  int64_t vocab, seq_len, d;
  double dropout;
  at::Tensor token, position;
};

// `x` in the dtype of `like` (a norm's float32 weight): under mixed precision the norms, and
// what they normalize, stay float32 while matrix products run in bfloat16.
at::Tensor InDtypeOf(const at::Tensor& x, const at::Tensor& like) {
  return x.scalar_type() == like.scalar_type() ? x : x.to(like.scalar_type());
}

// layer_norm over the last dimension d, its weight's and bias's gradients deferrable (the
// generic path of weight_gradients.h).
at::Tensor LayerNorm(const at::Tensor& x, int64_t d, const at::Tensor& weight,
                     const at::Tensor& bias, WeightGradientDeferral* deferral) {
  return SplitBackward(InDtypeOf(x, weight), {weight, bias}, deferral,
                       [&](const at::Tensor& in) { return at::layer_norm(in, {d}, weight, bias); });
}

// Pre-LN transformer block: x + attn(ln1(x)); x + mlp(ln2(x)).
struct GptBlockImpl : StatelessModule<GptBlockImpl> {
  GptBlockImpl(int64_t d, int64_t heads, int64_t n_layers, double dropout)
      : d(d), heads(heads), n_layers(n_layers), dropout(dropout) {
    reset();
  }
  void reset() override {
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layers));
    ln1_w = register_parameter("ln1_w", torch::ones({d}));
    ln1_b = register_parameter("ln1_b", torch::zeros({d}));
    qkv_w = register_parameter("qkv_w", Normal({3 * d, d}, 0.02));
    qkv_b = register_parameter("qkv_b", torch::zeros({3 * d}));
    proj_w = register_parameter("proj_w", Normal({d, d}, proj_std));
    proj_b = register_parameter("proj_b", torch::zeros({d}));
    ln2_w = register_parameter("ln2_w", torch::ones({d}));
    ln2_b = register_parameter("ln2_b", torch::zeros({d}));
    fc_w = register_parameter("fc_w", Normal({4 * d, d}, 0.02));
    fc_b = register_parameter("fc_b", torch::zeros({4 * d}));
    fc2_w = register_parameter("fc2_w", Normal({d, 4 * d}, proj_std));
    fc2_b = register_parameter("fc2_b", torch::zeros({d}));
  }
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx) {
    at::Tensor h = LayerNorm(x, d, ln1_w, ln1_b, ctx.weight_gradients);
    at::Tensor qkv = Linear(h, qkv_w, qkv_b, ctx.weight_gradients);
    at::Tensor y;
    if (dropout > 0 && is_training()) {
      y = CausalSelfAttention(qkv, heads, [&](const at::Tensor& probs) {
        return Dropout(probs, dropout, ctx, 1, /*training=*/true);
      });
    } else {
      y = CausalSelfAttention(qkv, heads);
    }
    at::Tensor out = x + Dropout(Linear(y, proj_w, proj_b, ctx.weight_gradients), dropout, ctx, 2,
                                 is_training());
    h = LayerNorm(out, d, ln2_w, ln2_b, ctx.weight_gradients);
    h = Linear(LinearGelu(h, fc_w, fc_b, ctx.weight_gradients), fc2_w, fc2_b, ctx.weight_gradients);
    return out + Dropout(h, dropout, ctx, 3, is_training());
  }
  int64_t d, heads, n_layers;
  double dropout;
  at::Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
};

struct LayerNormImpl : StatelessModule<LayerNormImpl> {
  explicit LayerNormImpl(int64_t d) : d(d) { reset(); }
  void reset() override {
    weight = register_parameter("weight", torch::ones({d}));
    bias = register_parameter("bias", torch::zeros({d}));
  }
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx) {
    return LayerNorm(x, d, weight, bias, ctx.weight_gradients);
  }
  int64_t d;
  at::Tensor weight, bias;
};

// Linear map, optionally followed by ReLU. PyTorch's default nn.Linear initialization.
struct LinearImpl : StatelessModule<LinearImpl> {
  LinearImpl(int64_t in, int64_t out, bool bias, bool relu, double init_std = 0)
      : in(in), out(out), use_bias(bias), relu(relu), init_std(init_std) {
    reset();
  }
  void reset() override {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight = register_parameter(
        "weight", init_std > 0 ? Normal({out, in}, init_std) : Uniform({out, in}, bound));
    if (use_bias) bias = register_parameter("bias", Uniform({out}, bound));
  }
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx) {
    at::Tensor y = Linear(x, weight, use_bias ? bias : at::Tensor(), ctx.weight_gradients);
    return relu ? at::relu(y) : y;
  }
  int64_t in, out;
  bool use_bias, relu;
  double init_std;
  at::Tensor weight, bias;
};

// ---------------------------------------------------------------- CNN

// Per-channel statistics of the micro-batches of each mini-batch, combined with Chan's
// parallel update (exact in any order up to rounding). Shared by all weight versions of a
// layer (Clone copies the pointer), since micro-batches of one mini-batch may run on a
// different version than the one that is updated at its end.
struct BatchStatistics {
  struct Moments {
    double count = 0;
    at::Tensor mean;  // per channel, float64
    at::Tensor m2;    // sum of squared deviations, float64
  };
  std::mutex mu;
  std::map<int64_t, Moments> by_mini_batch;

  void Add(int64_t mini_batch, const at::Tensor& x) {
    at::NoGradGuard no_grad;
    at::Tensor xd = x.detach().to(at::kDouble);
    const double n = static_cast<double>(x.numel() / x.size(1));
    at::Tensor mean = xd.mean({0, 2, 3});
    at::Tensor m2 = (xd - mean.view({1, -1, 1, 1})).pow(2).sum({0, 2, 3});
    std::lock_guard<std::mutex> lock(mu);
    Moments& acc = by_mini_batch[mini_batch];
    if (acc.count == 0) {
      acc = {n, mean, m2};
      return;
    }
    const double total = acc.count + n;
    at::Tensor delta = mean - acc.mean;
    acc.mean = acc.mean + delta * (n / total);
    acc.m2 = acc.m2 + m2 + delta.pow(2) * (acc.count * n / total);
    acc.count = total;
  }
  // Removes and returns mini-batch t's moments (count 0 if none).
  Moments Take(int64_t mini_batch) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_mini_batch.find(mini_batch);
    if (it == by_mini_batch.end()) return {};
    Moments m = std::move(it->second);
    by_mini_batch.erase(it);
    return m;
  }
};

// conv3x3 (no bias) -> BatchNorm with micro-batch statistics -> ReLU.
// Training: normalizes with the statistics of the micro-batch itself. Running statistics
// are updated once per mini-batch (FinishMiniBatch) from the mean and unbiased variance of
// all its micro-batches together, with PyTorch's momentum rule.
// With `pool` (vgg's last convolution of a stage), a 2x2 max pooling follows while both
// sides of the output are at least 2.
struct ConvBnReluImpl : torch::nn::Cloneable<ConvBnReluImpl> {
  ConvBnReluImpl(int64_t in, int64_t out, int64_t stride, bool pool = false)
      : in(in), out(out), stride(stride), pool(pool), stats(std::make_shared<BatchStatistics>()) {
    reset();
  }
  void reset() override {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in * 9));
    conv_w = register_parameter("conv_w", Uniform({out, in, 3, 3}, bound));
    bn_w = register_parameter("bn_w", torch::ones({out}));
    bn_b = register_parameter("bn_b", torch::zeros({out}));
    running_mean = register_buffer("running_mean", torch::zeros({out}));
    running_var = register_buffer("running_var", torch::ones({out}));
  }
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx) {
    // Under mixed precision the convolution runs in bfloat16; its normalization in float32.
    // The convolution on the generic path of weight_gradients.h. Not the batch norm: its
    // parameters' gradients are the per-channel sums its input's gradient computes anyway,
    // and deferring them would only run that pass over the activation again in W.
    at::Tensor y =
        InDtypeOf(SplitBackward(x, {conv_w}, ctx.weight_gradients,
                                [&](const at::Tensor& in) {
                                  return at::conv2d(in, conv_w, {}, {stride, stride}, {1, 1});
                                }),
                  bn_w);
    if (is_training()) {
      if (!ctx.recomputing) stats->Add(ctx.mini_batch, y);
      y = at::batch_norm(y, bn_w, bn_b, {}, {}, /*training=*/true, momentum, eps,
                         /*cudnn_enabled=*/false);
    } else {
      y = at::batch_norm(y, bn_w, bn_b, running_mean, running_var, /*training=*/false, momentum,
                         eps, false);
    }
    y = at::relu(y);
    if (pool && y.size(2) >= 2 && y.size(3) >= 2) y = at::max_pool2d(y, {2, 2});
    return y;
  }
  void finish_mini_batch(int64_t mini_batch) {
    BatchStatistics::Moments m = stats->Take(mini_batch);
    if (m.count < 2) return;
    at::NoGradGuard no_grad;
    at::Tensor var = m.m2 / (m.count - 1);
    running_mean.mul_(1 - momentum).add_(m.mean.to(running_mean.scalar_type()), momentum);
    running_var.mul_(1 - momentum).add_(var.to(running_var.scalar_type()), momentum);
  }
  void discard_mini_batch(int64_t mini_batch) { (void)stats->Take(mini_batch); }
  bool has_mini_batch_statistics() const { return true; }
  void use_own_statistics() { stats = std::make_shared<BatchStatistics>(); }

  static constexpr double momentum = 0.1;
  static constexpr double eps = 1e-5;
  int64_t in, out, stride;
  bool pool;
  std::shared_ptr<BatchStatistics> stats;
  at::Tensor conv_w, bn_w, bn_b, running_mean, running_var;
};

struct PoolLinearImpl : StatelessModule<PoolLinearImpl> {
  PoolLinearImpl(int64_t in, int64_t classes) : in(in), classes(classes) { reset(); }
  void reset() override {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    weight = register_parameter("weight", Uniform({classes, in}, bound));
    bias = register_parameter("bias", Uniform({classes}, bound));
  }
  at::Tensor forward(const at::Tensor& x, const LayerContext& ctx) {
    return Linear(x.mean({2, 3}), weight, bias, ctx.weight_gradients);
  }
  int64_t in, classes;
  at::Tensor weight, bias;
};

template <typename Impl, typename... Args>
std::unique_ptr<Layer> Make(std::vector<ParameterKinds> kinds, std::string name, Args&&... args) {
  return std::make_unique<NnLayer<Impl>>(
      std::move(name), std::make_shared<Impl>(std::forward<Args>(args)...), std::move(kinds));
}

}  // namespace

std::unique_ptr<Layer> BuildBuiltinLayer(const ModelConfig& c, int i) {
  // An LM head tied to the token embedding (TiedParameters) starts equal to it: its weight is
  // drawn from the embedding's seed, as the embedding draws its token table first.
  const bool tied_head = c.name == "gpt" && c.tie_embeddings && i == c.n_layers + 2;
  InitGeneratorScope init(LayerInitSeed(c.seed, tied_head ? 0 : i));
  const std::vector<ParameterKinds> kinds = BuiltinParameterKinds(c, i);
  if (c.name == "gpt") {
    if (i == 0) {
      return Make<GptEmbeddingImpl>(kinds, "embedding", c.vocab_size, c.seq_len, c.d_model,
                                    c.dropout);
    }
    if (i <= c.n_layers) {
      return Make<GptBlockImpl>(kinds, absl::StrCat("block", i - 1), c.d_model, c.n_heads,
                                c.n_layers, c.dropout);
    }
    if (i == c.n_layers + 1) return Make<LayerNormImpl>(kinds, "final_norm", c.d_model);
    return Make<LinearImpl>(kinds, "lm_head", c.d_model, c.vocab_size, /*bias=*/false,
                            /*relu=*/false, /*init_std=*/0.02);
  }
  if (c.name == "mlp") {
    const int64_t in = i == 0 ? c.input_dim : c.hidden;
    if (i < c.hidden_layers) {
      return Make<LinearImpl>(kinds, absl::StrCat("hidden", i), in, c.hidden, true, true);
    }
    return Make<LinearImpl>(kinds, "classifier", in, c.num_classes, true, false);
  }
  if (c.name == "vgg") {
    const std::vector<VggConv> convs = VggConvs(c);
    if (i < static_cast<int>(convs.size())) {
      return Make<ConvBnReluImpl>(kinds, absl::StrCat("conv", i), convs[i].in, convs[i].out, 1,
                                  convs[i].ends_stage);
    }
    return Make<PoolLinearImpl>(kinds, "classifier", convs.back().out, c.num_classes);
  }
  const int64_t in = i == 0 ? c.image_shape[0] : CnnChannels(c, i - 1);
  if (i < c.hidden_layers) {
    return Make<ConvBnReluImpl>(kinds, absl::StrCat("conv", i), in, CnnChannels(c, i),
                                CnnStride(i));
  }
  return Make<PoolLinearImpl>(kinds, "classifier", in, c.num_classes);
}

}  // namespace pipetrain::model
