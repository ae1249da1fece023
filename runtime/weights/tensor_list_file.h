// A list of tensors in LibTorch's torch::save format (Python's torch.load reads it): the
// weights a stage hands back to the launcher and the file `--save-weights` writes. The one
// place that includes LibTorch's serializer (its headers cost a translation unit ~15 s).
// Thread-compatible free functions; errors are Status, never exceptions.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace pipetrain::weights {

// The bytes of torch::save(tensors), serialized in memory: LibTorch's file writer throws
// from a destructor when the disk is full (which would end the process), so the caller
// writes the bytes itself. Internal with LibTorch's message if serializing fails.
absl::StatusOr<std::string> SerializeTensorList(const std::vector<at::Tensor>& tensors);

// The tensors of a file torch::save wrote (SerializeTensorList's bytes). DataLoss with
// LibTorch's message for a missing, truncated or foreign file.
absl::StatusOr<std::vector<at::Tensor>> LoadTensorList(const std::string& path);

}  // namespace pipetrain::weights
