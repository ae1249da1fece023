#include "runtime/memory/tensor_memory.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include "runtime/memory/cuda_tensor_memory.h"

namespace pipetrain::memory {
namespace {

std::atomic<int64_t> in_use{0};
std::atomic<int64_t> peak{0};
std::atomic<bool> installed{false};

void RaisePeak(int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// Each block is allocated with a 64-byte header in front that holds its size (the tensor's
// data stays 64-byte aligned). The data pointer is also the deleter's context, as
// c10::Allocator::raw_allocate requires.
constexpr size_t kHeader = 64;

void DeleteCounted(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  in_use.fetch_sub(*reinterpret_cast<int64_t*>(block), std::memory_order_relaxed);
  c10::free_cpu(block);
}

c10::DataPtr AllocateCounted(size_t n) {
  char* block = static_cast<char*>(c10::alloc_cpu(n + kHeader));
  *reinterpret_cast<int64_t*>(block) = static_cast<int64_t>(n);
  RaisePeak(in_use.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) +
            static_cast<int64_t>(n));
  void* data = block + kHeader;
  return {data, data, &DeleteCounted, c10::Device(c10::DeviceType::CPU)};
}

// c10::Allocator's interface changed after LibTorch 1.13: allocate() is const there and
// non-const from 2.x, which also adds a pure virtual copy_data(). Both allocate()s and
// copy_data() are declared without `override`, so that whichever the LibTorch in use declares
// is the one overridden (the others are plain members), and the class builds against both.
class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const { return AllocateCounted(n); }
  c10::DataPtr allocate(size_t n) { return AllocateCounted(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteCounted; }
};

}  // namespace

void CountTensorMemory() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingAllocator allocator;
    // Priority above the default allocator's registration (0).
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    installed.store(true);
  });
}

bool CountingTensorMemory() { return installed.load(); }

int64_t TensorBytesInUse() { return in_use.load(std::memory_order_relaxed); }

int64_t PeakTensorBytes() { return peak.load(std::memory_order_relaxed); }

void ResetPeakTensorBytes() { peak.store(in_use.load(std::memory_order_relaxed)); }

int64_t TensorBytesInUseOn(c10::Device device) {
  if (device.is_cpu()) return TensorBytesInUse();
  if (device.is_cuda()) return CudaTensorBytesInUse(device.has_index() ? device.index() : 0);
  return -1;
}

int64_t PeakTensorBytesOn(c10::Device device) {
  if (device.is_cpu()) return CountingTensorMemory() ? PeakTensorBytes() : 0;
  if (device.is_cuda()) return PeakCudaTensorBytes(device.has_index() ? device.index() : 0);
  return -1;
}

void ResetPeakTensorBytesOn(c10::Device device) {
  if (device.is_cpu()) ResetPeakTensorBytes();
  if (device.is_cuda()) ResetPeakCudaTensorBytes(device.has_index() ? device.index() : 0);
}

}  // namespace pipetrain::memory
