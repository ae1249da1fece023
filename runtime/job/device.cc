#include "runtime/job/device.h"

#include <algorithm>

#include <torch/cuda.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::job {

int VisibleCudaDevices() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

absl::StatusOr<c10::Device> DeviceForRank(const JobSpec& config, int index) {
  if (config.device() == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (config.device() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device: expected cpu or cuda, got '", config.device(), "'"));
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

c10::Device TensorDeviceOf(const std::string& device) {
  const int index = DeviceIndexOf(device);
  return index < 0 ? c10::Device(c10::DeviceType::CPU)
                   : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

int DeviceIndexOf(const std::string& device) {
  if (device == "cuda") return 0;
  int index = -1;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &index) && index >= 0) {
    return index;
  }
  return -1;
}

std::string CheckDeviceVisible(const std::string& device) {
  if (device == "cpu") return "";
  if (device != "cuda" && DeviceIndexOf(device) < 0) {
    return absl::StrCat("--device ", device, ": expected cpu, cuda or cuda:N");
  }
  const int visible = VisibleCudaDevices();
  if (DeviceIndexOf(device) >= visible) {
    return absl::StrCat("--device ", device, ": this process sees ", visible, " CUDA device",
                        visible == 1 ? "" : "s",
                        visible == 0 ? " (no GPU visible, or a LibTorch built without CUDA)" : "");
  }
  return "";
}

}  // namespace pipetrain::job
