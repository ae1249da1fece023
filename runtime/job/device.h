// Where a rank's tensors live: the one placement path of a job (docs/design.md section 2).
#pragma once

#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "runtime/job/job_config.h"

namespace pipetrain::job {

// device: cpu -> the CPU. device: cuda -> GPU `index` modulo the GPUs this process sees
// (stage processes pass their rank, so they spread over the GPUs; stages as threads share
// GPU 0; a worker passes its own). FailedPrecondition naming `device: cuda` when this
// process sees no GPU (a LibTorch built without CUDA, or no device visible).
absl::StatusOr<c10::Device> DeviceForRank(const JobConfig& config, int index);

// How many CUDA devices this process sees (0 with a CPU-only LibTorch).
int VisibleCudaDevices();

}  // namespace pipetrain::job
