// What kind of parameter a tensor of a layer is, as optimizers group them for weight decay
// (OptimizerConfig::no_decay: Megatron's and nanoGPT's "no decay on biases and norms").
// Plain data: no LibTorch (the coordinator validates the names).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pipetrain::model {

enum class ParameterKind { kBias, kNorm, kEmbedding };

// The kinds one parameter is of, a bit (KindBit) each: a norm's bias is both kNorm and kBias;
// 0 for a weight matrix or convolution kernel.
using ParameterKinds = uint32_t;
constexpr ParameterKinds KindBit(ParameterKind kind) { return 1u << static_cast<int>(kind); }
inline constexpr ParameterKind kAllParameterKinds[] = {ParameterKind::kBias, ParameterKind::kNorm,
                                                       ParameterKind::kEmbedding};

// "bias" | "norm" | "embedding".
std::string_view ParameterKindName(ParameterKind kind);
// The names above; InvalidArgument listing them for any other.
absl::StatusOr<ParameterKind> ParseParameterKind(std::string_view name);
// The kinds in `kinds`, by name, comma-separated ("" for none).
std::string ParameterKindsName(ParameterKinds kinds);

}  // namespace pipetrain::model
