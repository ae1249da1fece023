// Built-in models and models brought from Python as TorchScript.
//
//   gpt         : token + position embedding | n_layers pre-LN transformer blocks with causal
//                 self-attention | final LayerNorm | LM head. Layers: embedding, block0..,
//                 final_norm, lm_head (n_layers + 3 layers). Input [b, T] token ids.
//   mlp         : Linear+ReLU hidden layers, then a Linear classifier. Input [b, D].
//   cnn         : conv3x3+BatchNorm+ReLU blocks (BatchNorm with micro-batch statistics,
//                 see layer.h), then global average pooling + Linear. Input [b, C, H, W].
//   torchscript : a file saved from Python with torch.jit.script/trace of an nn.Sequential;
//                 each child module is one layer, in order.
// Initialization is a deterministic function of the seed. The loss is cross-entropy of the
// last layer's output [.., classes] against integer targets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/layer.h"

namespace pipetrain::model {

struct ModelConfig {
  std::string name = "gpt";  // gpt | mlp | cnn | torchscript
  uint64_t seed = 0;
  bool float64 = false;
  // gpt
  int64_t vocab_size = 64;
  int64_t seq_len = 32;
  int64_t d_model = 64;
  int64_t n_heads = 4;
  int64_t n_layers = 4;
  double dropout = 0.0;
  // mlp (input_dim) and cnn (image_shape); both use num_classes and hidden sizes
  int64_t input_dim = 32;
  std::vector<int64_t> image_shape = {3, 16, 16};
  int64_t hidden = 64;      // mlp hidden width / cnn channels
  int64_t hidden_layers = 3;
  int64_t num_classes = 10;
  // torchscript
  std::string torchscript_path;
};

// All invalid fields in one InvalidArgument ("; "-separated) (unknown name, non-positive sizes, d_model not
// divisible by n_heads, dropout outside [0, 1), ...).
absl::Status ValidateModelConfig(const ModelConfig& config);

// Builds all layers in float32 or float64 (config.float64), in training mode. A missing or
// unreadable TorchScript file is NotFound/InvalidArgument with the path and the reason.
absl::StatusOr<LayerList> BuildModel(const ModelConfig& config);

// Names of the built-in models, for --help and error messages.
std::vector<std::string> BuiltinModelNames();

// Number of parameters of each layer (a cost proxy for the default partition).
std::vector<double> ParameterCounts(const LayerList& layers);

}  // namespace pipetrain::model
