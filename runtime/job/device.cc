#include "runtime/job/device.h"

#include <algorithm>

#include <torch/cuda.h>

#include "absl/strings/str_cat.h"

namespace pipetrain::job {

int VisibleCudaDevices() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

absl::StatusOr<c10::Device> DeviceForRank(const JobConfig& config, int index) {
  if (config.device == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (config.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device: expected cpu or cuda, got '", config.device, "'"));
  }
  const int gpus = VisibleCudaDevices();
  if (gpus == 0) {
    return absl::FailedPreconditionError(
        "device: cuda, but this process sees no CUDA device (no GPU visible, or a LibTorch "
        "built without CUDA); run it where a GPU is, or with device: cpu");
  }
  return c10::Device(c10::DeviceType::CUDA,
                     static_cast<c10::DeviceIndex>(std::max(0, index) % gpus));
}

}  // namespace pipetrain::job
