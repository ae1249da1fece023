// Reporting every violation at once, on one line.
#pragma once

#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pipetrain {

// OK if `errors` is empty, else InvalidArgument "what: e1; e2; e3" (what may be empty).
inline absl::Status InvalidArgumentList(absl::string_view what,
                                        const std::vector<std::string>& errors) {
  if (errors.empty()) return absl::OkStatus();
  std::string joined = absl::StrJoin(errors, "; ");
  return absl::InvalidArgumentError(what.empty() ? joined : absl::StrCat(what, ": ", joined));
}

// The individual violations of a status made by InvalidArgumentList (empty if OK).
inline std::vector<std::string> ViolationsOf(const absl::Status& status) {
  if (status.ok()) return {};
  return absl::StrSplit(status.message(), "; ");
}

}  // namespace pipetrain
