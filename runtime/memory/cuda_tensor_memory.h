// A GPU's tensor bytes as LibTorch's CUDA caching allocator counts them (allocated bytes of
// the device, all streams; what the allocator caches beyond them is not in it). Built with a
// CUDA LibTorch (PIPETRAIN_CUDA_LIBTORCH), it reads the allocator's statistics; otherwise
// every function says so by returning -1 and does nothing; so does a GPU this process does
// not see.
#pragma once

#include <cstdint>

namespace pipetrain::memory {

// Bytes allocated on `device` now; -1 without CUDA.
int64_t CudaTensorBytesInUse(int device);
// The most bytes allocated on `device` since its last reset (or the start); -1 without CUDA.
int64_t PeakCudaTensorBytes(int device);
// Makes the device's peak its current allocation.
void ResetPeakCudaTensorBytes(int device);

}  // namespace pipetrain::memory
