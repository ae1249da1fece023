#include "runtime/memory/cuda_tensor_memory.h"

#if PIPETRAIN_CUDA_LIBTORCH
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace pipetrain::memory {

#if PIPETRAIN_CUDA_LIBTORCH

namespace {

bool Visible(int device) { return device >= 0 && device < c10::cuda::device_count(); }

}  // namespace

// allocated_bytes is indexed by the allocator's stat type; 0 is AGGREGATE (every pool) in
// every LibTorch from 1.13 on.
int64_t CudaTensorBytesInUse(int device) {
  if (!Visible(device)) return -1;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
}

int64_t PeakCudaTensorBytes(int device) {
  if (!Visible(device)) return -1;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
}

void ResetPeakCudaTensorBytes(int device) {
  if (Visible(device)) c10::cuda::CUDACachingAllocator::resetPeakStats(device);
}

#else

int64_t CudaTensorBytesInUse(int) { return -1; }
int64_t PeakCudaTensorBytes(int) { return -1; }
void ResetPeakCudaTensorBytes(int) {}

#endif

}  // namespace pipetrain::memory
