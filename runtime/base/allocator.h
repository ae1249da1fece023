// glibc malloc settings for a process that trains.
//
// glibc decides per process when to serve a block with mmap and when to give free heap back
// to the kernel, and raises both thresholds only after it has freed a large mmapped block.
// A training process allocates and frees the same ~100 KiB..MiB tensors every micro-batch
// (attention scores, logits, gradients); at the default 128 KiB thresholds each of those is
// mapped and unmapped, or the heap top trimmed, every time, and pays the page faults again.
// Measured on the default job with its 4 stages as threads: the last stage's compute took
// about 20% longer that way (docs/performance.md, "Step time against the previous build").
// Fixing the thresholds at start makes the behaviour the same whatever the process happened
// to allocate first.
#pragma once

#include <malloc.h>

namespace pipetrain {

// Blocks below 32 MiB come from the heap, and up to 64 MiB of free heap top is kept. Call
// once, early in main, before any thread starts.
inline void TuneAllocatorForTraining() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace pipetrain
