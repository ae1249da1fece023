// How the NCCL transport issues work and waits for it: NCCL calls grouped under the
// communicator's lock, each stream made to follow LibTorch's default stream, recorded events,
// and polling (with the deadline, NCCL's asynchronous errors and the abort reason) until
// NCCL has launched or an event completed. See nccl_transport_impl.h.
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/transport/nccl/nccl_transport_impl.h"

namespace pipetrain::transport::nccl {

absl::Status NcclTransport::IssueGroup(Channel& channel, const std::string& what,
                                       absl::FunctionRef<ncclResult_t(ncclComm_t)> calls) {
  ncclResult_t result;
  {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    if (channel.comm == nullptr) return aborted();
    result = ncclGroupStart();
    if (result == ncclSuccess) result = calls(channel.comm);
    const ncclResult_t ended = ncclGroupEnd();
    if (result == ncclSuccess) result = ended;
  }
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  return Fail(absl::UnavailableError(
      absl::StrCat(Self(), ": NCCL failed ", what, ": ", NcclErrorText(result))));
}

absl::Status NcclTransport::Issue(Channel& channel, const at::Tensor* outgoing,
                                  const at::Tensor* incoming, const std::string& what) {
  return IssueGroup(channel, what, [&](ncclComm_t comm) {
    ncclResult_t r = ncclSuccess;
    if (outgoing != nullptr) {
      r = ncclSend(outgoing->data_ptr(), outgoing->numel(), *NcclTypeOf(outgoing->scalar_type()),
                   channel.peer, comm, channel.stream);
    }
    if (r == ncclSuccess && incoming != nullptr) {
      r = ncclRecv(incoming->data_ptr(), incoming->numel(), *NcclTypeOf(incoming->scalar_type()),
                   channel.peer, comm, channel.stream);
    }
    return r;
  });
}

absl::Status NcclTransport::FollowCompute(Channel& channel, const std::string& what) {
  cudaEvent_t event;
  if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
    return Fail(CudaError(e, what));
  }
  const Event owned(event);  // destroying a recorded event is fine: CUDA defers it
  if (cudaError_t e = cudaEventRecord(event, cudaStreamLegacy); e != cudaSuccess) {
    return Fail(CudaError(e, what));
  }
  if (cudaError_t e = cudaStreamWaitEvent(channel.stream, event, 0); e != cudaSuccess) {
    return Fail(CudaError(e, what));
  }
  return absl::OkStatus();
}

absl::StatusOr<Event> NcclTransport::RecordEvent(Channel& channel, const std::string& what) {
  cudaEvent_t event;
  if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
    return Fail(CudaError(e, what));
  }
  Event owned(event);
  if (cudaError_t e = cudaEventRecord(event, channel.stream); e != cudaSuccess) {
    return Fail(CudaError(e, what));
  }
  return owned;
}

absl::Status NcclTransport::AwaitLaunch(Channel& channel, absl::Time deadline,
                                        const std::string& what) {
  return Poll(channel, deadline, what, []() -> absl::StatusOr<bool> { return true; });
}

absl::Status NcclTransport::AwaitEvent(Channel& channel, cudaEvent_t event, absl::Time deadline,
                                       const std::string& what) {
  return Poll(channel, deadline, what, [&]() -> absl::StatusOr<bool> {
    const cudaError_t state = QueryEvent(event);
    if (state == cudaSuccess) return true;
    if (state == cudaErrorNotReady) return false;
    return CudaError(state, what);
  });
}

absl::Status NcclTransport::Poll(Channel& channel, absl::Time deadline, const std::string& what,
                                 absl::FunctionRef<absl::StatusOr<bool>()> done) {
  for (;;) {
    if (absl::Status s = aborted(); !s.ok()) return s;
    ncclResult_t state;
    {
      std::lock_guard<std::mutex> lock(nccl_mu_);
      if (channel.comm == nullptr) return aborted();
      if (ncclResult_t r = ncclCommGetAsyncError(channel.comm, &state); r != ncclSuccess) {
        state = r;
      }
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return Fail(absl::UnavailableError(
          absl::StrCat(Self(), ": NCCL failed while ", what, ": ", NcclErrorText(state))));
    }
    if (state == ncclSuccess) {
      absl::StatusOr<bool> finished = done();
      if (!finished.ok()) return Fail(finished.status());
      if (*finished) return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(absl::StrCat(Self(), " timed out ", what)));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

absl::Status NcclTransport::CudaError(cudaError_t error, const std::string& what) const {
  return absl::InternalError(
      absl::StrCat(Self(), ": CUDA failed while ", what, ": ", cudaGetErrorString(error)));
}

}  // namespace pipetrain::transport::nccl
