// split_backward_bench: what zero-bubble's split backward costs on a stage, and what its
// generic path (runtime/model/weight_gradients.h SplitBackward: layer norms, embeddings,
// convolutions, TorchScript) adds.
//
// One stage of a built-in model (GPT: its blocks, final norm and head at d_model 256, 4
// heads, sequences of 64, micro-batches of 4, from a float input; CNN: the whole model on
// 3x32x32 images, micro-batches of 16), one intra-op thread, float32. Per micro-batch after
// the same forward:
//   B        the full backward (the stage does not split);
//   I+W      I then W with only the linear products deferred (the generic path off);
//   I+W gen  I then W with every parameter deferred (the generic path on, as zb1p, zbv and
//            dualpipev run it).
// The three run in turn, rotated each round (so load swings fall on all alike); a run is
// `--micro-batches` forwards and their backwards, timed around the backwards alone. Prints
// per model the median over rounds of each, and the medians of the per-round ratios to B.
//
// Run:  build-bench/bench/split_backward_bench [--rounds 9] [--micro-batches 8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "runtime/base/threads.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "runtime/model/weight_gradients.h"

namespace pipetrain::bench {
namespace {

enum class Mode { kFull, kLinearOnly, kGeneric };
constexpr Mode kModes[] = {Mode::kFull, Mode::kLinearOnly, Mode::kGeneric};

struct Model {
  std::string name;
  std::unique_ptr<model::StageModule> stage;
  at::Tensor input;
};

// Layers [first, end) of `c` as a stage, with an input of `input_shape`.
Model Stage(std::string name, const model::ModelConfig& c, int first,
            std::vector<int64_t> input_shape) {
  auto layers = model::BuildLayers(c, first, -1);
  if (!layers.ok()) std::abort();
  return {std::move(name), std::make_unique<model::StageModule>(first, *std::move(layers)),
          torch::randn(input_shape)};
}

Model Gpt() {
  model::ModelConfig c;
  c.name = "gpt";
  c.d_model = 256;
  c.n_heads = 4;
  c.n_layers = 4;
  c.seq_len = 64;
  c.vocab_size = 64;
  return Stage("gpt (4 blocks, final norm, head)", c, 1, {4, 64, 256});
}

Model Cnn() {
  model::ModelConfig c;
  c.name = "cnn";
  c.image_shape = {3, 32, 32};
  c.hidden = 32;
  c.hidden_layers = 4;
  c.num_classes = 10;
  return Stage("cnn (4 conv+batch norm, classifier)", c, 0, {16, 3, 32, 32});
}

// Seconds of `micro_batches` backwards under `mode` (forwards untimed).
double Run(Model& m, Mode mode, int micro_batches) {
  m.stage->weight_gradients().set_splits(mode == Mode::kGeneric);
  double seconds = 0;
  for (int j = 0; j < micro_batches; ++j) {
    at::Tensor x = m.input.detach().clone().requires_grad_(true);
    model::LayerContext ctx;
    ctx.micro_batch = j;
    const at::Tensor loss = m.stage->Forward(x, ctx).square().mean();
    const auto t0 = std::chrono::steady_clock::now();
    if (mode == Mode::kFull) {
      loss.backward();
    } else {
      model::WeightGradientQueue queue;
      {
        model::DeferWeightGradients defer(m.stage->weight_gradients(), queue);
        loss.backward();
      }
      queue.Run();
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  m.stage->ZeroGrad();
  return seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int Main(int argc, char** argv) {
  int rounds = 9, micro_batches = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (value < 1) break;
    if (flag == "--rounds") rounds = value;
    if (flag == "--micro-batches") micro_batches = value;
  }
  SetIntraOpThreads(1);
  torch::manual_seed(1);
  std::vector<Model> models;
  models.push_back(Gpt());
  models.push_back(Cnn());
  std::printf("one stage, one intra-op thread, float32; %d rounds of %d micro-batches\n\n", rounds,
              micro_batches);
  std::printf(
      "| stage | B | I+W (linear products deferred) | I+W gen (every parameter) | "
      "I+W / B | I+W gen / B | I+W gen / I+W |\n|---|---|---|---|---|---|---|\n");
  for (Model& m : models) {
    for (Mode mode : kModes) Run(m, mode, 2);  // warm-up
    std::vector<std::vector<double>> seconds(3);
    std::vector<double> linear_ratio, generic_ratio, generic_vs_linear;
    for (int round = 0; round < rounds; ++round) {
      double t[3] = {0, 0, 0};
      for (int k = 0; k < 3; ++k) {
        const int mode = (round + k) % 3;
        t[mode] = Run(m, kModes[mode], micro_batches) / micro_batches;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      for (int mode = 0; mode < 3; ++mode) seconds[mode].push_back(t[mode]);
      linear_ratio.push_back(t[1] / t[0]);
      generic_ratio.push_back(t[2] / t[0]);
      generic_vs_linear.push_back(t[2] / t[1]);
    }
    std::printf("| %s | %.2f ms | %.2f ms | %.2f ms | %.3f | %.3f | %.3f |\n", m.name.c_str(),
                Median(seconds[0]) * 1e3, Median(seconds[1]) * 1e3, Median(seconds[2]) * 1e3,
                Median(linear_ratio), Median(generic_ratio), Median(generic_vs_linear));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) { return pipetrain::bench::Main(argc, argv); }
