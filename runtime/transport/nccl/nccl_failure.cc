// How the NCCL transport fails: the first abort reason kept and returned by every later
// call, every communicator aborted at once (one thread each), and the buffers of failed work
// kept alive until the transport is destroyed. See nccl_transport_impl.h.
#include <system_error>
#include <thread>

#include "runtime/transport/nccl/nccl_transport_impl.h"

namespace pipetrain::transport::nccl {

void NcclTransport::Abort(const absl::Status& reason) {
  if (abort_.Latch(reason)) AbortCommunicators();
}

absl::Status NcclTransport::Fail(const absl::Status& error) {
  Abort(error);
  return aborted();
}

absl::Status NcclTransport::aborted() { return abort_.reason(); }

void NcclTransport::AbortCommunicators() { AbortAll(TakeCommunicators()); }

std::vector<ncclComm_t> NcclTransport::TakeCommunicators() {
  std::lock_guard<std::mutex> lock(nccl_mu_);
  std::vector<ncclComm_t> comms;
  for (auto& channel : channels_) {
    if (channel->comm != nullptr) comms.push_back(channel->comm);
    channel->comm = nullptr;
  }
  return comms;
}

void NcclTransport::AbortAll(const std::vector<ncclComm_t>& comms) const {
  const int device = options_.device;
  std::vector<std::thread> aborters;
  for (ncclComm_t comm : comms) {
    auto abort = [comm, device] {
      cudaSetDevice(device);
      ncclCommAbort(comm);
    };
    try {
      aborters.emplace_back(abort);
    } catch (const std::system_error&) {
      abort();  // no thread to spare: abort it here
    }
  }
  for (std::thread& aborter : aborters) aborter.join();
}

void NcclTransport::Bury(std::vector<at::Tensor> tensors) {
  std::lock_guard<std::mutex> lock(graveyard_mu_);
  for (at::Tensor& t : tensors) {
    if (t.defined()) graveyard_.push_back(std::move(t));
  }
}

}  // namespace pipetrain::transport::nccl
