#include "runtime/weights/tensor_list_file.h"

#include <exception>
#include <sstream>

#include <torch/serialize.h>

#include "absl/strings/str_cat.h"

namespace pipetrain::weights {

absl::StatusOr<std::string> SerializeTensorList(const std::vector<at::Tensor>& tensors) {
  std::ostringstream bytes;
  try {
    torch::save(tensors, bytes);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("serializing ", tensors.size(), " tensors: ", e.what()));
  }
  return bytes.str();
}

absl::StatusOr<std::vector<at::Tensor>> LoadTensorList(const std::string& path) {
  std::vector<at::Tensor> tensors;
  try {
    torch::load(tensors, path);
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("reading tensors from ", path, ": ", e.what()));
  }
  return tensors;
}

}  // namespace pipetrain::weights
