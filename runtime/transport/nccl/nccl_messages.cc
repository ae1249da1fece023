// The NCCL transport's messages: Send (a header, then the payload, on the link's stream, kept
// alive until delivered), Recv (the header checked against what was asked for, then the
// payload in the header's dtype and shape), Flush, and the loopback's staging. See
// nccl_transport_impl.h.
#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/transport/nccl/nccl_transport_impl.h"

namespace pipetrain::transport::nccl {

absl::Status NcclTransport::SendMessage(int peer, MessageKind kind, int64_t micro_batch,
                                        const at::Tensor& tensor) {
  if (absl::Status s = aborted(); !s.ok()) return s;
  const std::string message_name = absl::StrCat("the ", MessageKindName(kind), " of micro-batch ",
                                                micro_batch, " to ", Describe(peer));
  Channel* channel = Link(peer, kind, micro_batch, /*sending=*/true);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Self(), " has no link to send ", message_name));
  }
  if (absl::Status s = CheckTensor(tensor, "send " + message_name); !s.ok()) return s;
  DeviceGuard device(options_.device);
  Message message;
  message.header_host =
      at::empty({kHeaderSize}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  WireHeader wire;
  wire.kind = static_cast<int64_t>(kind);
  wire.micro_batch = micro_batch;
  wire.dtype = static_cast<int64_t>(tensor.scalar_type());
  wire.shape = tensor.sizes().vec();
  EncodeWireHeader(wire, message.header_host.data_ptr<int64_t>());
  message.header = at::empty({kHeaderSize}, CudaOptions(at::kLong));
  message.payload = tensor.detach().contiguous();
  if (options_.loopback) {
    std::lock_guard<std::mutex> lock(staged_mu_);
    channel->staged.push_back(std::move(message));
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(send_mu_);
  Reap();
  // Launching needs no receiver (the link was warmed up); the deadline only bounds NCCL.
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  const std::string sending = "sending " + message_name;
  Event done;
  const absl::Status enqueued = [&]() -> absl::Status {
    if (absl::Status s = FollowCompute(*channel, sending); !s.ok()) return s;
    if (absl::Status s = UploadHeader(*channel, message, sending); !s.ok()) return s;
    for (const at::Tensor* part : {&message.header, &message.payload}) {
      if (part->numel() == 0) continue;  // an empty payload: the header says all
      if (absl::Status s = Issue(*channel, part, nullptr, sending); !s.ok()) return s;
      if (absl::Status s = AwaitLaunch(*channel, deadline, sending); !s.ok()) return s;
    }
    absl::StatusOr<Event> event = RecordEvent(*channel, sending);
    if (!event.ok()) return event.status();
    done = std::move(event).value();
    return absl::OkStatus();
  }();
  if (!enqueued.ok()) {
    // What was enqueued may still read or write these.
    Bury({message.header_host, message.header, message.payload});
    return enqueued;
  }
  in_flight_.push_back(
      {std::move(message), std::move(done), channel, "delivering " + message_name});
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> NcclTransport::Recv(int peer, MessageKind kind, int64_t micro_batch,
                                               absl::Time deadline) {
  if (absl::Status s = aborted(); !s.ok()) return s;
  const std::string wanted = absl::StrCat("the ", MessageKindName(kind), " of micro-batch ",
                                          micro_batch, " from ", Describe(peer));
  Channel* channel = Link(peer, kind, micro_batch, /*sending=*/false);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(Self(), " has no link to receive ", wanted));
  }
  DeviceGuard device(options_.device);
  const std::string what = "waiting for " + wanted;
  std::optional<Message> source;  // loopback: the staged message this receive sends itself
  at::Tensor header;
  at::Tensor header_host;
  at::Tensor payload;
  // On a failure, work enqueued on the stream may still use these: keep them until the end.
  auto failed = [&](absl::Status status) {
    Bury({header, header_host, payload});
    if (source) Bury({source->header_host, source->header, source->payload});
    return status;
  };
  if (options_.loopback) {
    absl::Status staged = Poll(*channel, deadline, what, [&]() -> absl::StatusOr<bool> {
      std::lock_guard<std::mutex> lock(staged_mu_);
      if (channel->staged.empty()) return false;
      source = std::move(channel->staged.front());
      channel->staged.pop_front();
      return true;
    });
    if (!staged.ok()) return staged;
    if (absl::Status s = FollowCompute(*channel, what); !s.ok()) return failed(s);
    if (absl::Status s = UploadHeader(*channel, *source, what); !s.ok()) return failed(s);
  }
  header = at::empty({kHeaderSize}, CudaOptions(at::kLong));
  header_host = at::empty({kHeaderSize}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  if (absl::Status s = Receive(*channel, source ? &source->header : nullptr, header, &header_host,
                               deadline, what);
      !s.ok()) {
    return failed(s);
  }
  absl::StatusOr<WireHeader> h =
      DecodeWireHeader(header_host.data_ptr<int64_t>(), [](int64_t dtype) -> int64_t {
        const int64_t size = WireElementSize(dtype);
        return size > 0 && NcclTypeOf(static_cast<at::ScalarType>(dtype)) ? size : 0;
      });
  if (!h.ok() || h->inline_payload) {
    return Fail(absl::DataLossError(
        absl::StrCat(Self(), " received a malformed header while ", what,
                     h.ok() ? std::string() : absl::StrCat(": ", h.status().message()))));
  }
  if (h->kind != static_cast<int64_t>(kind) || h->micro_batch != micro_batch) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        Self(), " expected ", wanted, " but the next message from ", Describe(peer), " is the ",
        MessageKindName(static_cast<MessageKind>(h->kind)), " of micro-batch ", h->micro_batch,
        " (NCCL delivers a link's messages in the order they were sent)")));
  }
  payload = at::empty(h->shape, CudaOptions(static_cast<at::ScalarType>(h->dtype)));
  if (payload.numel() > 0) {
    if (absl::Status s = Receive(*channel, source ? &source->payload : nullptr, payload, nullptr,
                                 deadline, what);
        !s.ok()) {
      return failed(s);
    }
  }
  return payload;
}

absl::Status NcclTransport::Flush(absl::Time deadline) {
  DeviceGuard device(options_.device);
  std::lock_guard<std::mutex> lock(send_mu_);
  for (InFlight& sent : in_flight_) {
    if (absl::Status s = AwaitEvent(*sent.channel, sent.done.get(), deadline, sent.what); !s.ok()) {
      return s;
    }
  }
  in_flight_.clear();
  return aborted();
}

Channel* NcclTransport::Link(int peer, MessageKind kind, int64_t number, bool sending) const {
  if (options_.loopback) {
    if (peer != options_.stage) return nullptr;
    return FlowsForward(kind) ? loopback_forward_ : loopback_backward_;
  }
  const int from = sending ? options_.stage : peer, to = sending ? peer : options_.stage;
  const int index = LinkOf(links_, options_.chunks_per_rank(), from, to, kind, number);
  const auto it = link_channels_.find(index);
  return it == link_channels_.end() ? nullptr : it->second;
}

absl::Status NcclTransport::CheckTensor(const at::Tensor& tensor, const std::string& doing) const {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(Self(), " cannot ", doing, ": no tensor"));
  }
  if (!tensor.device().is_cuda() || tensor.device().index() != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        Self(), " cannot ", doing, ": the NCCL transport moves tensors on cuda:", options_.device,
        ", not ", SpecOf(tensor).ToString(), " on ", tensor.device().str()));
  }
  if (!NcclTypeOf(tensor.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        Self(), " cannot ", doing, ": NCCL does not carry ", SpecOf(tensor).ToString()));
  }
  if (tensor.dim() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(Self(), " cannot ", doing, ": ", tensor.dim(),
                                                   " dimensions (at most ", kMaxDims, ")"));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Receive(Channel& channel, const at::Tensor* loopback_source,
                                    const at::Tensor& buffer, const at::Tensor* host,
                                    absl::Time deadline, const std::string& what) {
  if (absl::Status s = FollowCompute(channel, what); !s.ok()) return s;
  if (absl::Status s = Issue(channel, loopback_source, &buffer, what); !s.ok()) return s;
  if (absl::Status s = AwaitLaunch(channel, deadline, what); !s.ok()) return s;
  if (host != nullptr) {
    const cudaError_t e = cudaMemcpyAsync(host->data_ptr(), buffer.data_ptr(), host->nbytes(),
                                          cudaMemcpyDeviceToHost, channel.stream);
    if (e != cudaSuccess) return Fail(CudaError(e, what));
  }
  absl::StatusOr<Event> done = RecordEvent(channel, what);
  if (!done.ok()) return done.status();
  return AwaitEvent(channel, done->get(), deadline, what);
}

absl::Status NcclTransport::UploadHeader(Channel& channel, const Message& message,
                                         const std::string& what) {
  const cudaError_t e = cudaMemcpyAsync(message.header.data_ptr(), message.header_host.data_ptr(),
                                        kHeaderBytes, cudaMemcpyHostToDevice, channel.stream);
  return e == cudaSuccess ? absl::OkStatus() : Fail(CudaError(e, what));
}

void NcclTransport::Reap() {
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [](const InFlight& sent) {
                                    return QueryEvent(sent.done.get()) == cudaSuccess;
                                  }),
                   in_flight_.end());
}

}  // namespace pipetrain::transport::nccl
