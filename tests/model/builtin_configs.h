// Small configurations of every built-in model and an input for each: what the model tests
// build and run. Header-only; each call returns fresh values.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "runtime/model/model_config.h"

namespace pipetrain {

// gpt, mlp, cnn and vgg, each a few layers of a few units, in that order.
inline std::vector<model::ModelConfig> BuiltinConfigs() {
  using model::ModelConfig;
  std::vector<ModelConfig> configs;
  ModelConfig gpt;
  gpt.name = "gpt";
  gpt.vocab_size = 19;
  gpt.seq_len = 7;
  gpt.d_model = 12;
  gpt.n_heads = 3;
  gpt.n_layers = 3;
  configs.push_back(gpt);
  ModelConfig mlp;
  mlp.name = "mlp";
  mlp.input_dim = 5;
  mlp.hidden = 9;
  mlp.hidden_layers = 3;
  mlp.num_classes = 4;
  configs.push_back(mlp);
  ModelConfig cnn;
  cnn.name = "cnn";
  cnn.image_shape = {2, 7, 9};  // odd sizes: the stride-2 block rounds up
  cnn.hidden = 4;
  cnn.hidden_layers = 3;
  cnn.num_classes = 3;
  configs.push_back(cnn);
  ModelConfig vgg;
  vgg.name = "vgg";
  vgg.image_shape = {2, 9, 6};  // pooled to 4x3 and 2x1, then too narrow to pool again
  vgg.hidden = 2;
  vgg.hidden_layers = 11;
  vgg.num_classes = 3;
  configs.push_back(vgg);
  return configs;
}

// A batch of `batch` inputs of model `c`: token ids or features.
inline at::Tensor SampleInput(const model::ModelConfig& c, int64_t batch) {
  if (c.name == "gpt") return torch::randint(c.vocab_size, {batch, c.seq_len}, torch::kLong);
  if (c.name == "mlp") return torch::randn({batch, c.input_dim});
  return torch::randn({batch, c.image_shape[0], c.image_shape[1], c.image_shape[2]});
}

}  // namespace pipetrain
