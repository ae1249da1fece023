#include "runtime/weights/optimizer_config.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/errors.h"

namespace pipetrain::weights {

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  std::vector<std::string> errors;
  if (c.name != "sgd" && c.name != "adamw") {
    errors.push_back(absl::StrCat("unknown optimizer '", c.name, "' (known: sgd, adamw)"));
  }
  if (!(c.lr > 0)) errors.push_back(absl::StrCat("optimizer.lr must be > 0, got ", c.lr));
  if (c.weight_decay < 0) {
    errors.push_back(absl::StrCat("optimizer.weight_decay must be >= 0, got ", c.weight_decay));
  }
  if (c.momentum < 0 || c.momentum >= 1) {
    errors.push_back(absl::StrCat("optimizer.momentum must be in [0, 1), got ", c.momentum));
  }
  if (c.beta1 < 0 || c.beta1 >= 1 || c.beta2 < 0 || c.beta2 >= 1) {
    errors.push_back(absl::StrCat("optimizer.beta1/beta2 must be in [0, 1), got ", c.beta1, "/",
                                  c.beta2));
  }
  if (!(c.eps > 0)) errors.push_back(absl::StrCat("optimizer.eps must be > 0, got ", c.eps));
  return InvalidArgumentList("", errors);
}

}  // namespace pipetrain::weights
