#include "runtime/model/parameter_kind.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::model {

std::string_view ParameterKindName(ParameterKind kind) {
  switch (kind) {
    case ParameterKind::kBias: return "bias";
    case ParameterKind::kNorm: return "norm";
    case ParameterKind::kEmbedding: return "embedding";
  }
  return "unknown";
}

absl::StatusOr<ParameterKind> ParseParameterKind(std::string_view name) {
  for (ParameterKind kind : kAllParameterKinds) {
    if (ParameterKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown parameter kind '", std::string(name),
                                                 "' (one of: bias, norm, embedding)"));
}

std::string ParameterKindsName(ParameterKinds kinds) {
  std::vector<std::string> names;
  for (ParameterKind kind : kAllParameterKinds) {
    if (kinds & KindBit(kind)) names.emplace_back(ParameterKindName(kind));
  }
  return absl::StrJoin(names, ",");
}

}  // namespace pipetrain::model
