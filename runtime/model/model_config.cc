#include "runtime/model/model_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/errors.h"
#include "runtime/base/hash.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::model {
namespace {

constexpr int64_t kMaxDepth = 1 << 16;

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

std::vector<std::string> BuiltinModelNames() { return {"gpt", "mlp", "cnn", "vgg", "torchscript"}; }

absl::Status ValidateModelConfig(const ModelConfig& c) {
  std::vector<std::string> errors;
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) errors.push_back(absl::StrCat("model.", field, " must be > 0, got ", v));
  };
  auto depth = [&](const char* field, int64_t v) {
    positive(field, v);
    if (v > kMaxDepth) {
      errors.push_back(absl::StrCat("model.", field, " must be <= ", kMaxDepth, ", got ", v));
    }
  };
  if (c.name == "gpt") {
    positive("vocab_size", c.vocab_size);
    positive("seq_len", c.seq_len);
    positive("d_model", c.d_model);
    positive("n_heads", c.n_heads);
    depth("n_layers", c.n_layers);
    if (c.d_model > 0 && c.n_heads > 0 && c.d_model % c.n_heads != 0) {
      errors.push_back(absl::StrCat("model.d_model (", c.d_model,
                                    ") must be divisible by model.n_heads (", c.n_heads, ")"));
    }
  } else if (c.name == "mlp" || c.name == "cnn" || c.name == "vgg") {
    positive("hidden", c.hidden);
    if (c.name == "vgg") {
      if (VggConvs(c).empty()) {
        errors.push_back(absl::StrCat("model.hidden_layers must be 11, 13, 16 or 19 for vgg ",
                                      "(the paper's configurations A, B, D, E), got ",
                                      c.hidden_layers));
      }
    } else {
      depth("hidden_layers", c.hidden_layers);
    }
    positive("num_classes", c.num_classes);
    if (c.name == "mlp") positive("input_dim", c.input_dim);
    if (c.name == "cnn" || c.name == "vgg") {
      if (c.image_shape.size() != 3) {
        errors.push_back("model.image_shape must be [channels, height, width]");
      } else {
        for (int64_t v : c.image_shape) positive("image_shape[]", v);
      }
    }
  } else if (c.name == "torchscript") {
    if (c.torchscript_path.empty()) errors.push_back("model.path is required for torchscript");
  } else {
    errors.push_back(absl::StrCat("unknown model '", c.name,
                                  "' (known: ", absl::StrJoin(BuiltinModelNames(), ", "), ")"));
  }
  if (c.dropout < 0 || c.dropout >= 1) {
    errors.push_back(absl::StrCat("model.dropout must be in [0, 1), got ", c.dropout));
  }
  if (c.tie_embeddings && c.name != "gpt") {
    errors.push_back(
        absl::StrCat("model.tie_embeddings: only a gpt has an embedding and an "
                     "LM head to tie, not ",
                     c.name));
  }
  return InvalidArgumentList("", errors);
}

absl::StatusOr<std::vector<std::string>> BuiltinLayerNames(const ModelConfig& c) {
  if (c.name == "torchscript") {
    return absl::FailedPreconditionError(
        "the layers of a TorchScript model are known once its file is loaded");
  }
  if (c.name != "gpt" && c.name != "mlp" && c.name != "cnn" && c.name != "vgg") {
    return absl::InvalidArgumentError(absl::StrCat("unknown model '", c.name, "'"));
  }
  if (c.name == "vgg" && VggConvs(c).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vgg has depth 11, 13, 16 or 19, not ", c.hidden_layers));
  }
  const int64_t depth = c.name == "gpt"   ? c.n_layers
                        : c.name == "vgg" ? static_cast<int64_t>(VggConvs(c).size())
                                          : c.hidden_layers;
  if (depth < 1 || depth > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat("a depth of ", depth, " layers"));
  }
  std::vector<std::string> names;
  auto numbered = [&](const char* prefix) {
    for (int64_t i = 0; i < depth; ++i) names.push_back(absl::StrCat(prefix, i));
  };
  if (c.name == "gpt") {
    names.push_back("embedding");
    numbered("block");
    names.push_back("final_norm");
    names.push_back("lm_head");
  } else {
    numbered(c.name == "mlp" ? "hidden" : "conv");
    names.push_back("classifier");
  }
  return names;
}

absl::StatusOr<std::vector<LayerInfo>> BuiltinLayers(const ModelConfig& c) {
  PT_ASSIGN_OR_RETURN(std::vector<std::string> names, BuiltinLayerNames(c));
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  // Parameters per layer, in the order of `names`.
  std::vector<int64_t> counts;
  if (c.name == "gpt") {
    const int64_t d = c.d_model;
    counts.push_back(c.vocab_size * d + c.seq_len * d);  // token and position embedding
    for (int64_t i = 0; i < c.n_layers; ++i) {
      // ln1 (2d), qkv (3d*d + 3d), proj (d*d + d), ln2 (2d), fc (4d*d + 4d), fc2 (4d*d + d)
      counts.push_back(12 * d * d + 13 * d);
    }
    counts.push_back(2 * d);             // final_norm
    counts.push_back(d * c.vocab_size);  // lm_head, no bias
  } else if (c.name == "mlp") {
    int64_t in = c.input_dim;
    for (int64_t i = 0; i < c.hidden_layers; ++i) {
      counts.push_back(in * c.hidden + c.hidden);
      in = c.hidden;
    }
    counts.push_back(in * c.num_classes + c.num_classes);
  } else if (c.name == "vgg") {
    int64_t in = 0;
    for (const VggConv& conv : VggConvs(c)) {
      counts.push_back(conv.out * conv.in * 9 + 2 * conv.out);
      in = conv.out;
    }
    counts.push_back(in * c.num_classes + c.num_classes);
  } else {  // cnn
    int64_t in = c.image_shape[0];
    for (int64_t i = 0; i < c.hidden_layers; ++i) {
      const int64_t out = CnnChannels(c, i);
      counts.push_back(out * in * 9 + 2 * out);  // conv weight, BatchNorm weight and bias
      in = out;
    }
    counts.push_back(in * c.num_classes + c.num_classes);
  }
  std::vector<LayerInfo> layers;
  for (size_t i = 0; i < names.size(); ++i) {
    layers.push_back({names[i], counts[i], BuiltinParameterKinds(c, static_cast<int>(i))});
  }
  return layers;
}

std::vector<ParameterKinds> BuiltinParameterKinds(const ModelConfig& c, int layer) {
  constexpr ParameterKinds kBias = KindBit(ParameterKind::kBias);
  constexpr ParameterKinds kNorm = KindBit(ParameterKind::kNorm);
  constexpr ParameterKinds kEmbedding = KindBit(ParameterKind::kEmbedding);
  if (c.name == "gpt") {
    if (layer == 0) return {kEmbedding, kEmbedding};  // token, position
    if (layer <= c.n_layers) {
      // ln1 w, b; qkv w, b; proj w, b; ln2 w, b; fc w, b; fc2 w, b
      return {kNorm, kNorm | kBias, 0, kBias, 0, kBias, kNorm, kNorm | kBias, 0, kBias, 0, kBias};
    }
    if (layer == c.n_layers + 1) return {kNorm, kNorm | kBias};  // final_norm
    return {0};                                                  // lm_head, no bias
  }
  const int64_t convolutions =
      c.name == "vgg" ? static_cast<int64_t>(VggConvs(c).size()) : c.hidden_layers;
  if ((c.name == "cnn" || c.name == "vgg") && layer < convolutions) {
    return {0, kNorm, kNorm | kBias};  // kernel, BatchNorm weight and bias
  }
  return {0, kBias};  // a linear layer: matrix, bias
}

absl::StatusOr<std::vector<int64_t>> BuiltinLayerOutputShape(const ModelConfig& c, int layer,
                                                             const std::vector<int64_t>& in) {
  if (c.name == "torchscript") {
    return absl::FailedPreconditionError(
        "a TorchScript layer's output shape is known by running it");
  }
  if (c.name == "vgg" && VggConvs(c).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vgg has depth 11, 13, 16 or 19, not ", c.hidden_layers));
  }
  const int64_t depth = c.name == "gpt"   ? c.n_layers + 3
                        : c.name == "vgg" ? static_cast<int64_t>(VggConvs(c).size()) + 1
                                          : c.hidden_layers + 1;
  if (layer < 0 || layer >= depth) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " does not exist (the model has ", depth, " layers)"));
  }
  auto unfit = [&](const std::string& expected) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " of ", c.name,
                                                   " expects an input of ", expected, ", got ",
                                                   ShapeText(in)));
  };
  if (c.name == "gpt") {
    if (layer == 0) {
      if (in.size() != 2 || in[1] > c.seq_len) {
        return unfit(absl::StrCat("[batch, tokens <= ", c.seq_len, "]"));
      }
      return std::vector<int64_t>{in[0], in[1], c.d_model};
    }
    if (in.size() != 3 || in[2] != c.d_model) {
      return unfit(absl::StrCat("[batch, tokens, ", c.d_model, "]"));
    }
    if (layer == depth - 1) return std::vector<int64_t>{in[0], in[1], c.vocab_size};
    return in;
  }
  if (c.name == "mlp") {
    const int64_t width = layer == 0 ? c.input_dim : c.hidden;
    if (in.size() != 2 || in[1] != width) return unfit(absl::StrCat("[batch, ", width, "]"));
    return std::vector<int64_t>{in[0], layer == depth - 1 ? c.num_classes : c.hidden};
  }
  if (c.name == "vgg") {
    const std::vector<VggConv> convs = VggConvs(c);
    const int64_t channels =
        layer < static_cast<int>(convs.size()) ? convs[layer].in : convs.back().out;
    if (in.size() != 4 || in[1] != channels || in[2] < 1 || in[3] < 1) {
      return unfit(absl::StrCat("[batch, ", channels, ", height, width]"));
    }
    if (layer == depth - 1) return std::vector<int64_t>{in[0], c.num_classes};
    const bool pool = convs[layer].ends_stage && in[2] >= 2 && in[3] >= 2;  // 3x3, padding 1
    return std::vector<int64_t>{in[0], convs[layer].out, pool ? in[2] / 2 : in[2],
                                pool ? in[3] / 2 : in[3]};
  }
  // cnn
  const int64_t channels = layer == 0 ? c.image_shape[0] : CnnChannels(c, layer - 1);
  if (in.size() != 4 || in[1] != channels || in[2] < 1 || in[3] < 1) {
    return unfit(absl::StrCat("[batch, ", channels, ", height, width]"));
  }
  if (layer == depth - 1) return std::vector<int64_t>{in[0], c.num_classes};
  const int64_t stride = CnnStride(layer);  // 3x3, padding 1
  return std::vector<int64_t>{in[0], CnnChannels(c, layer), (in[2] - 1) / stride + 1,
                              (in[3] - 1) / stride + 1};
}

int64_t CnnChannels(const ModelConfig& c, int64_t conv) { return c.hidden * (conv == 0 ? 1 : 2); }

std::vector<VggConv> VggConvs(const ModelConfig& c) {
  // Convolutions per stage in the paper's configurations A (11), B (13), D (16), E (19).
  std::vector<int> per_stage;
  switch (c.hidden_layers) {
    case 11: per_stage = {1, 1, 2, 2, 2}; break;
    case 13: per_stage = {2, 2, 2, 2, 2}; break;
    case 16: per_stage = {2, 2, 3, 3, 3}; break;
    case 19: per_stage = {2, 2, 4, 4, 4}; break;
    default: return {};
  }
  const int64_t widths[] = {1, 2, 4, 8, 8};
  std::vector<VggConv> convs;
  int64_t in = c.image_shape.empty() ? 0 : c.image_shape[0];
  for (size_t stage = 0; stage < per_stage.size(); ++stage) {
    for (int k = 0; k < per_stage[stage]; ++k) {
      const int64_t out = c.hidden * widths[stage];
      convs.push_back({in, out, k + 1 == per_stage[stage]});
      in = out;
    }
  }
  return convs;
}
int64_t CnnStride(int64_t conv) { return conv == 1 ? 2 : 1; }

std::vector<TieGroup> TiedParameters(const ModelConfig& config) {
  if (config.name != "gpt" || !config.tie_embeddings) return {};
  // The embedding's parameters are (token, position); the head's (weight).
  return {{{0, 0}, {static_cast<int>(config.n_layers) + 2, 0}}};
}

uint64_t LayerInitSeed(uint64_t seed, int layer) {
  return Mix64(Mix64(seed) ^ (static_cast<uint64_t>(layer) + 0x5851F42D4C957F2DULL));
}

}  // namespace pipetrain::model
