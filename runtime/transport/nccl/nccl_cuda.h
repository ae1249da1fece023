// The CUDA runtime and NCCL as the NCCL transport uses them: the NCCL type of a LibTorch
// dtype, an NCCL error in words, an event query that leaves no error behind, owned events,
// and a scoped current device. No LibTorch CUDA headers (nccl_transport.h says why).
// Thread-safe: each call touches only its arguments and the calling thread's CUDA state.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

namespace pipetrain::transport::nccl {

// The NCCL type of `type`; none for a dtype the transport does not carry.
std::optional<ncclDataType_t> NcclTypeOf(at::ScalarType type);

// ncclGetErrorString of `result`, with NCCL's last error message in parentheses if it has one.
std::string NcclErrorText(ncclResult_t result);

// cudaEventQuery, without leaving cudaErrorNotReady behind as the thread's last CUDA error,
// where LibTorch's next kernel-launch check would find it.
cudaError_t QueryEvent(cudaEvent_t event);

struct EventDestroyer {
  void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
// A CUDA event, destroyed with its owner (CUDA defers that until a recorded event completes).
using Event = std::unique_ptr<CUevent_st, EventDestroyer>;

// Makes `device` the calling thread's current CUDA device while it lives.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = device;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ != device_) cudaSetDevice(previous_);
  }

 private:
  int device_;
  int previous_ = 0;
};

}  // namespace pipetrain::transport::nccl
