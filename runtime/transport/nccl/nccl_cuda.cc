// The CUDA and NCCL helpers of the NCCL transport. See nccl_cuda.h.
#include "runtime/transport/nccl/nccl_cuda.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::transport::nccl {

std::optional<ncclDataType_t> NcclTypeOf(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    default: return std::nullopt;
  }
}

std::string NcclErrorText(ncclResult_t result) {
  const std::string last = ncclGetLastError(nullptr);
  return absl::StrCat(ncclGetErrorString(result),
                      last.empty() ? "" : absl::StrCat(" (", last, ")"));
}

cudaError_t QueryEvent(cudaEvent_t event) {
  const cudaError_t state = cudaEventQuery(event);
  if (state == cudaErrorNotReady) cudaGetLastError();
  return state;
}

}  // namespace pipetrain::transport::nccl
