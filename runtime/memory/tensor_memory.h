// Bytes of CPU tensor storage in use in this process, counted at the allocator: the number a
// planner predicts (tensors only; code, libraries and allocator slack are not in it).
//
// CountTensorMemory() replaces LibTorch's CPU allocator for the rest of the process with one
// that allocates the same way (c10::alloc_cpu) and counts; storage allocated before it is not
// counted (its frees are not either). Each allocation costs 64 bytes and two atomic additions.
// Thread-safe.
#pragma once

#include <cstdint>

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

}  // namespace pipetrain::memory
