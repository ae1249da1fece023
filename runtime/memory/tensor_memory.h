// Bytes of CPU tensor storage in use in this process, counted at the allocator: the number a
// planner predicts (tensors only; code, libraries and allocator slack are not in it).
//
// CountTensorMemory() replaces LibTorch's CPU allocator for the rest of the process with one
// that allocates the same way (c10::alloc_cpu) and counts; storage allocated before it is not
// counted (its frees are not either). Each allocation costs 64 bytes and two atomic additions.
// Thread-safe. A GPU's tensors are counted by LibTorch's CUDA allocator: see PeakTensorBytesOn.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

namespace pipetrain::memory {

// Installs the counter (once; later calls do nothing). Call before building models.
void CountTensorMemory();
// False until CountTensorMemory() ran.
bool CountingTensorMemory();

// Bytes allocated through the counter and not yet freed.
int64_t TensorBytesInUse();
// The most TensorBytesInUse() has been since the last ResetPeakTensorBytes() (or the start).
int64_t PeakTensorBytes();
// Makes the peak the current use.
void ResetPeakTensorBytes();

// The same for the tensors on `device`: on the CPU the counter above (0 before
// CountTensorMemory()); on a GPU the CUDA caching allocator's own statistics for that device
// (its allocated bytes, not what it caches), or -1 where this build's LibTorch has no CUDA or
// the GPU is not visible.
int64_t TensorBytesInUseOn(c10::Device device);
int64_t PeakTensorBytesOn(c10::Device device);
void ResetPeakTensorBytesOn(c10::Device device);

}  // namespace pipetrain::memory
