// Where a rank's tensors live: the one placement path of a job (docs/design.md section 2).
#pragma once

#include <string>

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::job {

// device: cpu -> the CPU. device: cuda -> GPU `index` modulo the GPUs this process sees
// (stage processes pass their rank, so they spread over the GPUs; stages as threads share
// GPU 0; a worker passes its own). FailedPrecondition naming `device: cuda` when this
// process sees no GPU (a LibTorch built without CUDA, or no device visible).
absl::StatusOr<c10::Device> DeviceForRank(const JobSpec& config, int index);

// How many CUDA devices this process sees (0 with a CPU-only LibTorch).
int VisibleCudaDevices();

// A device as a worker's --device names it: "cpu", "cuda" (GPU 0) or "cuda:N". The one
// parse of that spelling: its GPU (N, 0 for cuda, -1 for cpu or anything else), where its
// tensors live, and whether this process can run stages there ("" if so, else why not).
int DeviceIndexOf(const std::string& device);
c10::Device TensorDeviceOf(const std::string& device);
std::string CheckDeviceVisible(const std::string& device);

}  // namespace pipetrain::job
