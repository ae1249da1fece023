// What a model is, as plain data, and what can be known about a built-in model without
// building it: its layers' names, their parameter counts and the shape each one outputs.
// No LibTorch here: the coordinator validates jobs with this alone.
//
//   gpt         : token + position embedding | n_layers pre-LN transformer blocks with causal
//                 self-attention | final LayerNorm | LM head. Layers: embedding, block0..,
//                 final_norm, lm_head (n_layers + 3 layers). Input [b, T] token ids.
//   mlp         : Linear+ReLU hidden layers, then a Linear classifier. Input [b, D].
//   cnn         : conv3x3+BatchNorm+ReLU blocks (the second with stride 2), then global
//                 average pooling + Linear. Input [b, C, H, W].
//   vgg         : VGG (Simonyan & Zisserman, 2015) with BatchNorm: five stages of
//                 conv3x3+BatchNorm+ReLU layers (hidden_layers 11, 13, 16 or 19 picks the
//                 paper's configuration A, B, D or E: 8, 10, 13 or 16 convolutions) of
//                 hidden x 1, 2, 4, 8, 8 channels (hidden 64: the paper's widths), each stage
//                 ending in 2x2 max pooling while both sides are at least 2; then global
//                 average pooling + Linear (one classifier for the paper's three fully
//                 connected layers). Input [b, C, H, W].
//   torchscript : a file saved from Python with torch.jit.script/trace of an nn.Sequential;
//                 each child module is one layer, in order. Its layers are known only once
//                 the file is loaded (model_zoo.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/parameter_kind.h"

namespace pipetrain::model {

struct ModelConfig {
  std::string name = "gpt";  // gpt | mlp | cnn | vgg | torchscript
  uint64_t seed = 0;
  bool float64 = false;
  // gpt
  int64_t vocab_size = 64;
  int64_t seq_len = 32;
  int64_t d_model = 64;
  int64_t n_heads = 4;
  int64_t n_layers = 4;
  double dropout = 0.0;
  // The LM head's weight is the token embedding's (GPT-2's weight tying): one parameter, held
  // as a copy by each stage that has one of the two layers (TiedParameters).
  bool tie_embeddings = false;
  // torchscript: tie groups "A=B[=C...]" of "child.parameter" names (the first canonical),
  // resolved against the loaded model when the job is planned (model::ScriptTieGroups).
  std::vector<std::string> tie;
  // mlp (input_dim), cnn and vgg (image_shape); all use num_classes and hidden sizes
  int64_t input_dim = 32;
  std::vector<int64_t> image_shape = {3, 16, 16};
  int64_t hidden = 64;        // mlp hidden width / cnn channels / vgg first stage's channels
  int64_t hidden_layers = 3;  // mlp, cnn: layers before the classifier; vgg: 11, 13, 16, 19
  int64_t num_classes = 10;
  // torchscript
  std::string torchscript_path;
};

// All invalid fields in one InvalidArgument ("; "-separated) (unknown name, non-positive
// sizes, d_model not divisible by n_heads, dropout outside [0, 1), ...).
absl::Status ValidateModelConfig(const ModelConfig& config);

// Names of the built-in models, for --help and error messages.
std::vector<std::string> BuiltinModelNames();

struct LayerInfo {
  std::string name;
  int64_t num_parameters = 0;
  // The kinds of each of its parameter tensors, in its Parameters() order (weight decay's
  // groups, parameter_kind.h).
  std::vector<ParameterKinds> parameter_kinds;
};

// The layer names of a built-in model in order; they depend only on its name and depth, so
// they are known even when other fields are invalid. FailedPrecondition for a TorchScript
// model, InvalidArgument for an unknown model or a depth outside [1, 65536].
absl::StatusOr<std::vector<std::string>> BuiltinLayerNames(const ModelConfig& config);

// The layers of a built-in model in order, exactly as BuildLayers names and sizes them.
// FailedPrecondition for a TorchScript model (known once loaded); InvalidArgument for an
// invalid config or a depth above 65536 layers.
absl::StatusOr<std::vector<LayerInfo>> BuiltinLayers(const ModelConfig& config);

// The shape of built-in layer `layer`'s output for an input of `input_shape` (its dtype is
// the model's float type; only a gpt's embedding takes integer ids). InvalidArgument when
// the input does not fit the layer (wrong rank or size).
absl::StatusOr<std::vector<int64_t>> BuiltinLayerOutputShape(
    const ModelConfig& config, int layer, const std::vector<int64_t>& input_shape);

// cnn: output channels and stride of conv block `conv` (the second block halves the
// resolution). One definition for the formulas here and the layers model_zoo builds.
int64_t CnnChannels(const ModelConfig& config, int64_t conv);
int64_t CnnStride(int64_t conv);

// vgg: its convolutions in order, each with its channels and whether it ends a stage (then
// a 2x2 max pooling follows it when both sides of its output are at least 2). Empty for a
// depth that is not one of the paper's (11, 13, 16, 19). One definition for the formulas
// here and the layers model_zoo builds.
struct VggConv {
  int64_t in = 0, out = 0;
  bool ends_stage = false;
};
std::vector<VggConv> VggConvs(const ModelConfig& config);

// One parameter of the model that several layers use (tied weights): each member is a
// layer's parameter by position in its Parameters(). The first member is the canonical one:
// every member starts equal to it, a checkpoint stores it there only, and the members'
// gradients are summed in this order before every update (each holder of a member keeps a
// copy and takes the same step).
struct ParameterRef {
  int layer = 0;
  int parameter = 0;
  bool operator==(const ParameterRef& o) const {
    return layer == o.layer && parameter == o.parameter;
  }
};
using TieGroup = std::vector<ParameterRef>;

// The tie groups of a built-in model: a gpt with tie_embeddings, {embedding's token table,
// lm_head's weight}; none otherwise.
std::vector<TieGroup> TiedParameters(const ModelConfig& config);

// The kinds of built-in layer `layer`'s parameters, in its Parameters() order: the one
// definition for the built-in models (their layers report these). gpt: the embedding's token
// and position tables embeddings; a block's two LayerNorms' weights norms and their biases
// norms and biases, its four linear biases biases, its matrices none; the final LayerNorm's
// weight a norm, its bias a norm and a bias; the head's matrix none. mlp: each linear's
// matrix none, its bias a bias. cnn, vgg: each convolution's kernel none, its BatchNorm's
// weight a norm and bias a norm and a bias; the classifier's matrix none, its bias a bias.
// REQUIRES: `config` is valid and built in, `layer` one of its layers.
std::vector<ParameterKinds> BuiltinParameterKinds(const ModelConfig& config, int layer);

// The seed of layer `layer`'s initial parameters: a layer's initial values depend only on
// (job seed, global layer index, model config), never on the partition.
uint64_t LayerInitSeed(uint64_t seed, int layer);

}  // namespace pipetrain::model
