#include "runtime/transport/nccl/nccl_transport.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "runtime/transport/wire_header.h"

namespace pipetrain::transport {
namespace {

constexpr int kMaxDims = kWireMaxDims;
constexpr int kHeaderSize = kWireHeaderWords;  // wire_header.h (the inline flag always 0)
constexpr size_t kHeaderBytes = kHeaderSize * sizeof(int64_t);
constexpr auto kPollInterval = std::chrono::microseconds(50);
// How long destroying a healthy transport waits for its communicators to finalize.
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);

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

// cudaEventQuery, without leaving cudaErrorNotReady behind as the thread's last CUDA error,
// where LibTorch's next kernel-launch check would find it.
cudaError_t QueryEvent(cudaEvent_t event) {
  const cudaError_t state = cudaEventQuery(event);
  if (state == cudaErrorNotReady) cudaGetLastError();
  return state;
}

struct EventDestroyer {
  void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
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

// A message being sent: its header (filled on the host, copied to the GPU on the link's
// stream) and its contiguous payload, all kept alive until NCCL has sent them.
struct Message {
  at::Tensor header_host;  // pinned
  at::Tensor header;
  at::Tensor payload;
};

// One NCCL communicator with its own stream.
struct Channel {
  enum class Role { kSend, kReceive, kLoopback, kReduce };
  Role role;
  std::string name;  // "the link for activations to stage 1 (rank 1)"
  std::string key;   // where its ncclUniqueId is published in the store
  int ranks;         // communicator size
  int rank;          // this process's rank in the communicator
  int peer;          // the rank at the other end of a link (this process's own in loopback)
  ncclComm_t comm = nullptr;  // guarded by NcclTransport::nccl_mu_; null once aborted
  cudaStream_t stream = nullptr;
  std::deque<Message> staged;  // loopback: sent, waiting for Recv; guarded by staged_mu_
};

class NcclTransport : public Transport {
 public:
  NcclTransport(std::shared_ptr<rendezvous::KeyValueStore> store, NcclTransportOptions options)
      : store_(std::move(store)), options_(std::move(options)) {}

  // A healthy transport finalizes its communicators, so that what NCCL is still moving (e.g.
  // the last send, unflushed) gets there; a failed one, or one whose communicators do not
  // finalize in time, aborts them, killing whatever still waits for a peer. Then it waits for
  // every stream before freeing what their work may still use.
  ~NcclTransport() override {
    DeviceGuard device(options_.device);
    if (aborted().ok()) {
      CloseCommunicators(absl::Now() + kFinalizeTimeout);
    } else {
      AbortCommunicators();
    }
    for (auto& channel : channels_) {
      if (channel->stream != nullptr) cudaStreamSynchronize(channel->stream);
    }
    in_flight_.clear();
    graveyard_.clear();
    for (auto& channel : channels_) {
      channel->staged.clear();
      if (channel->stream != nullptr) cudaStreamDestroy(channel->stream);
    }
  }

  // Creates the channels, exchanges their ids, initializes the communicators and sends one
  // warm-up message over every link. REQUIRES: the current device is options_.device.
  absl::Status Connect() {
    const absl::Time deadline = absl::Now() + options_.connect_timeout;
    using Role = Channel::Role;
    const int s = options_.stage;
    if (options_.loopback) {
      activations_out_ = activations_in_ =
          AddChannel(Role::kLoopback, "the loopback link for activations",
                     "nccl/loopback/activations", 1, 0, 0);
      gradients_out_ = gradients_in_ =
          AddChannel(Role::kLoopback, "the loopback link for gradients",
                     "nccl/loopback/gradients", 1, 0, 0);
      replicas_ = AddChannel(Role::kReduce, "the loopback communicator for reductions",
                             "nccl/loopback/replicas", 1, 0, 0);
    } else {
      // One communicator per direction of every link; in each, the lower stage is rank 0.
      auto key = [this](const char* kind, int from, int to) {
        return absl::StrCat("nccl/replica", options_.replica, "/", kind, from, "to", to);
      };
      if (s + 1 < options_.stages) {
        const std::string next = Describe(s + 1);
        activations_out_ = AddChannel(Role::kSend, "the link for activations to " + next,
                                      key("activations", s, s + 1), 2, 0, 1);
        gradients_in_ = AddChannel(Role::kReceive, "the link for gradients from " + next,
                                   key("gradients", s + 1, s), 2, 0, 1);
      }
      if (s > 0) {
        const std::string previous = Describe(s - 1);
        activations_in_ = AddChannel(Role::kReceive, "the link for activations from " + previous,
                                     key("activations", s - 1, s), 2, 1, 0);
        gradients_out_ = AddChannel(Role::kSend, "the link for gradients to " + previous,
                                    key("gradients", s, s - 1), 2, 1, 0);
      }
      if (options_.replicas > 1) {
        replicas_ = AddChannel(Role::kReduce,
                               absl::StrCat("the communicator of the ", options_.replicas,
                                            " replicas of stage ", s),
                               absl::StrCat("nccl/stage", s, "/replicas"), options_.replicas,
                               options_.replica, 0);
      }
    }
    for (auto& channel : channels_) {
      if (cudaError_t e = cudaStreamCreateWithFlags(&channel->stream, cudaStreamNonBlocking);
          e != cudaSuccess) {
        return CudaError(e, "creating the stream of " + channel->name);
      }
    }
    absl::StatusOr<std::vector<ncclUniqueId>> ids = ExchangeIds(deadline);
    if (!ids.ok()) return ids.status();
    for (size_t i = 0; i < channels_.size(); ++i) {
      Channel& channel = *channels_[i];
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclResult_t result;
      {
        std::lock_guard<std::mutex> lock(nccl_mu_);
        result = ncclCommInitRankConfig(&channel.comm, channel.ranks, (*ids)[i], channel.rank,
                                        &config);
      }
      if (result != ncclSuccess && result != ncclInProgress) {
        return Fail(absl::UnavailableError(absl::StrCat(
            Self(), ": NCCL failed creating ", channel.name, ": ", NcclErrorText(result))));
      }
    }
    for (auto& channel : channels_) {
      if (absl::Status s = AwaitLaunch(*channel, deadline, "connecting " + channel->name);
          !s.ok()) {
        return s;
      }
    }
    return WarmUpLinks(deadline);
  }

  int stage() const override { return options_.stage; }

  absl::Status SendMessage(int peer, MessageKind kind, int64_t micro_batch,
                           const at::Tensor& tensor) override {
    if (absl::Status s = aborted(); !s.ok()) return s;
    const std::string message_name = absl::StrCat("the ", MessageKindName(kind), " of micro-batch ",
                                                  micro_batch, " to ", Describe(peer));
    Channel* channel = Link(peer, kind, /*sending=*/true);
    if (channel == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(Self(), " has no link to send ", message_name));
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

  absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t micro_batch,
                                  absl::Time deadline) override {
    if (absl::Status s = aborted(); !s.ok()) return s;
    const std::string wanted = absl::StrCat("the ", MessageKindName(kind), " of micro-batch ",
                                            micro_batch, " from ", Describe(peer));
    Channel* channel = Link(peer, kind, /*sending=*/false);
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
    header_host =
        at::empty({kHeaderSize}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
    if (absl::Status s = Receive(*channel, source ? &source->header : nullptr, header,
                                 &header_host, deadline, what);
        !s.ok()) {
      return failed(s);
    }
    absl::StatusOr<WireHeader> h = DecodeWireHeader(
        header_host.data_ptr<int64_t>(), [](int64_t dtype) -> int64_t {
          const int64_t size = WireElementSize(dtype);
          return size > 0 && NcclTypeOf(static_cast<at::ScalarType>(dtype)) ? size : 0;
        });
    if (!h.ok() || h->inline_payload) {
      return Fail(absl::DataLossError(absl::StrCat(
          Self(), " received a malformed header while ", what,
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
      if (absl::Status s = Receive(*channel, source ? &source->payload : nullptr, payload,
                                   nullptr, deadline, what);
          !s.ok()) {
        return failed(s);
      }
    }
    return payload;
  }

  absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) override {
    return StartAllReduceMean(tensors, deadline)->Wait(deadline);
  }

  // One grouped ncclAllReduce (ncclAvg) per tensor, in place; Wait() waits for its event.
  std::unique_ptr<PendingReduction> StartAllReduceMean(std::vector<at::Tensor> tensors,
                                                       absl::Time deadline) override {
    auto pending = std::make_unique<NcclReduction>(this, std::move(tensors));
    pending->status = StartReduction(*pending, deadline);
    return pending;
  }

  void Abort(const absl::Status& reason) override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (!abort_reason_.ok()) return;
      abort_reason_ = reason;
    }
    AbortCommunicators();
  }

  absl::Status Flush(absl::Time deadline) override {
    DeviceGuard device(options_.device);
    std::lock_guard<std::mutex> lock(send_mu_);
    for (InFlight& sent : in_flight_) {
      if (absl::Status s = AwaitEvent(*sent.channel, sent.done.get(), deadline, sent.what);
          !s.ok()) {
        return s;
      }
    }
    in_flight_.clear();
    return aborted();
  }

 private:
  struct NcclReduction : public PendingReduction {
    NcclReduction(NcclTransport* owner, std::vector<at::Tensor> tensors)
        : owner(owner), tensors(std::move(tensors)) {}
    // Dropped before its reduction completed: the tensors live on until the transport dies.
    ~NcclReduction() override {
      if (done && QueryEvent(done.get()) != cudaSuccess) owner->Bury(std::move(tensors));
    }
    absl::Status Wait(absl::Time deadline) override {
      if (!status.ok() || !done) return status;
      DeviceGuard device(owner->options_.device);
      status = owner->AwaitEvent(*owner->replicas_, done.get(), deadline, owner->ReductionWhat());
      if (!status.ok()) owner->Bury(tensors);  // the reduction may still write into them
      done.reset();
      return status;
    }
    NcclTransport* owner;             // outlives the reduction
    std::vector<at::Tensor> tensors;  // kept alive until the reduction completes
    Event done;                       // null when nothing was enqueued or once waited for
    absl::Status status;
  };

  struct InFlight {
    Message message;
    Event done;
    Channel* channel;
    std::string what;  // "delivering the activation of micro-batch 3 to stage 1 (rank 1)"
  };

  int RankOf(int stage) const { return options_.replica * options_.stages + stage; }
  std::string Describe(int stage) const {
    return absl::StrCat("stage ", stage, " (rank ", RankOf(stage), ")");
  }
  std::string Self() const { return Describe(options_.stage); }
  std::string ReductionWhat() const {
    return absl::StrCat("averaging gradients among the ", options_.replicas, " replicas of stage ",
                        options_.stage);
  }
  at::TensorOptions CudaOptions(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA, options_.device);
  }

  Channel* AddChannel(Channel::Role role, std::string name, std::string key, int ranks, int rank,
                      int peer) {
    auto channel = std::make_unique<Channel>();
    channel->role = role;
    channel->name = std::move(name);
    channel->key = std::move(key);
    channel->ranks = ranks;
    channel->rank = rank;
    channel->peer = peer;
    channels_.push_back(std::move(channel));
    return channels_.back().get();
  }

  // The channel that carries `kind` to (sending) or from `peer`: activations and control
  // messages flow to the next stage, gradients to the previous one; in loopback, all to this
  // stage itself.
  Channel* Link(int peer, MessageKind kind, bool sending) const {
    const bool downstream = kind != MessageKind::kGradient;
    const int toward = downstream == sending ? 1 : -1;
    if (peer != (options_.loopback ? options_.stage : options_.stage + toward)) return nullptr;
    if (downstream) return sending ? activations_out_ : activations_in_;
    return sending ? gradients_out_ : gradients_in_;
  }

  absl::Status CheckTensor(const at::Tensor& tensor, const std::string& doing) const {
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
      return absl::InvalidArgumentError(absl::StrCat(Self(), " cannot ", doing, ": ",
                                                     tensor.dim(), " dimensions (at most ",
                                                     kMaxDims, ")"));
    }
    return absl::OkStatus();
  }

  // Every creator publishes its ids before anyone waits, so no process waits for an id that
  // a waiting process has yet to publish.
  absl::StatusOr<std::vector<ncclUniqueId>> ExchangeIds(absl::Time deadline) {
    std::vector<ncclUniqueId> ids(channels_.size());
    for (size_t i = 0; i < channels_.size(); ++i) {
      if (channels_[i]->rank != 0) continue;
      if (ncclResult_t r = ncclGetUniqueId(&ids[i]); r != ncclSuccess) {
        return absl::UnavailableError(absl::StrCat(Self(), ": NCCL failed making the id of ",
                                                   channels_[i]->name, ": ", NcclErrorText(r)));
      }
      const std::string id(ids[i].internal, NCCL_UNIQUE_ID_BYTES);
      if (absl::Status s = store_->Set(channels_[i]->key, id); !s.ok()) return s;
    }
    for (size_t i = 0; i < channels_.size(); ++i) {
      if (channels_[i]->rank == 0) continue;
      absl::StatusOr<std::string> id = store_->Get(
          channels_[i]->key, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      if (!id.ok()) {
        return absl::Status(id.status().code(),
                            absl::StrCat(Self(), " did not receive the NCCL id of ",
                                         channels_[i]->name, ": ", id.status().message()));
      }
      if (id->size() != NCCL_UNIQUE_ID_BYTES) {
        return absl::DataLossError(absl::StrCat(Self(), ": the NCCL id of ", channels_[i]->name,
                                                " has ", id->size(), " bytes"));
      }
      std::copy(id->begin(), id->end(), ids[i].internal);
    }
    return ids;
  }

  // One message over every link, so that NCCL makes its peer connections here rather than in
  // the first Send (whose launch would then wait for the receiver).
  absl::Status WarmUpLinks(absl::Time deadline) {
    const at::Tensor token = at::zeros({1}, CudaOptions(at::kLong));  // a default-stream fill
    std::vector<Channel*> links;
    std::vector<at::Tensor> received;
    const absl::Status warmed = [&]() -> absl::Status {
      for (auto& channel : channels_) {
        if (channel->role == Channel::Role::kReduce) continue;
        const std::string what = "connecting " + channel->name;
        links.push_back(channel.get());
        received.push_back(at::empty({1}, CudaOptions(at::kLong)));
        const bool sends = channel->role != Channel::Role::kReceive;
        const bool receives = channel->role != Channel::Role::kSend;
        if (absl::Status s = FollowCompute(*channel, what); !s.ok()) return s;
        if (absl::Status s = Issue(*channel, sends ? &token : nullptr,
                                   receives ? &received.back() : nullptr, what);
            !s.ok()) {
          return s;
        }
      }
      std::vector<Event> done;
      for (Channel* link : links) {
        const std::string what = "connecting " + link->name;
        if (absl::Status s = AwaitLaunch(*link, deadline, what); !s.ok()) return s;
        absl::StatusOr<Event> event = RecordEvent(*link, what);
        if (!event.ok()) return event.status();
        done.push_back(std::move(event).value());
      }
      for (size_t i = 0; i < links.size(); ++i) {
        if (absl::Status s =
                AwaitEvent(*links[i], done[i].get(), deadline, "connecting " + links[i]->name);
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }();
    if (!warmed.ok()) {
      received.push_back(token);
      Bury(std::move(received));  // warm-up messages may still be in flight
    }
    return warmed;
  }

  absl::Status StartReduction(NcclReduction& reduction, absl::Time deadline) {
    if (absl::Status s = aborted(); !s.ok()) return s;
    for (size_t i = 0; i < reduction.tensors.size(); ++i) {
      const at::Tensor& t = reduction.tensors[i];
      const std::string doing = absl::StrCat("average tensor ", i, " across replicas");
      if (absl::Status s = CheckTensor(t, doing); !s.ok()) return s;
      if (!t.is_contiguous()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Self(), " cannot ", doing, ": it is not contiguous"));
      }
    }
    if (replicas_ == nullptr) return absl::OkStatus();
    DeviceGuard device(options_.device);
    const std::string what = ReductionWhat();
    const absl::Status started = [&]() -> absl::Status {
      if (absl::Status s = FollowCompute(*replicas_, what); !s.ok()) return s;
      absl::Status issued = IssueGroup(*replicas_, what, [&](ncclComm_t comm) {
        for (const at::Tensor& t : reduction.tensors) {
          if (t.numel() == 0) continue;
          const ncclResult_t r =
              ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), *NcclTypeOf(t.scalar_type()),
                            ncclAvg, comm, replicas_->stream);
          if (r != ncclSuccess) return r;
        }
        return ncclSuccess;
      });
      if (!issued.ok()) return issued;
      if (absl::Status s = AwaitLaunch(*replicas_, deadline, what); !s.ok()) return s;
      absl::StatusOr<Event> done = RecordEvent(*replicas_, what);
      if (!done.ok()) return done.status();
      reduction.done = std::move(done).value();
      return absl::OkStatus();
    }();
    if (!started.ok()) Bury(reduction.tensors);  // part of the reduction may have been enqueued
    return started;
  }

  // Issues the NCCL calls of `calls` as one group on `channel`'s communicator. The caller then
  // waits for the launch (AwaitLaunch) before enqueueing anything else on the channel's stream.
  absl::Status IssueGroup(Channel& channel, const std::string& what,
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

  // Sends `outgoing` to and/or receives `incoming` from `channel`'s peer; both at once only in
  // loopback, where NCCL requires a rank's send to itself to share a group with its receive.
  absl::Status Issue(Channel& channel, const at::Tensor* outgoing, const at::Tensor* incoming,
                     const std::string& what) {
    return IssueGroup(channel, what, [&](ncclComm_t comm) {
      ncclResult_t r = ncclSuccess;
      if (outgoing != nullptr) {
        r = ncclSend(outgoing->data_ptr(), outgoing->numel(),
                     *NcclTypeOf(outgoing->scalar_type()), channel.peer, comm, channel.stream);
      }
      if (r == ncclSuccess && incoming != nullptr) {
        r = ncclRecv(incoming->data_ptr(), incoming->numel(),
                     *NcclTypeOf(incoming->scalar_type()), channel.peer, comm, channel.stream);
      }
      return r;
    });
  }

  // Receives into `buffer` (in loopback, sending `loopback_source` into it), then copies it to
  // the pinned `host` tensor if given; returns when all of it has completed. On a failure the
  // caller keeps the tensors alive (Bury): the receive and the copy may still be queued.
  absl::Status Receive(Channel& channel, const at::Tensor* loopback_source,
                       const at::Tensor& buffer, const at::Tensor* host, absl::Time deadline,
                       const std::string& what) {
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

  // Makes `channel`'s stream wait for everything enqueued so far on the legacy default stream
  // (LibTorch's compute): the kernels that produced what the transport is about to read, and
  // those that last used memory the caching allocator has just handed out for it to write (a
  // freed block is reused at once, in default-stream order). Call it after allocating and
  // before enqueueing.
  absl::Status FollowCompute(Channel& channel, const std::string& what) {
    cudaEvent_t event;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
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

  absl::Status UploadHeader(Channel& channel, const Message& message, const std::string& what) {
    const cudaError_t e = cudaMemcpyAsync(message.header.data_ptr(),
                                          message.header_host.data_ptr(), kHeaderBytes,
                                          cudaMemcpyHostToDevice, channel.stream);
    return e == cudaSuccess ? absl::OkStatus() : Fail(CudaError(e, what));
  }

  absl::StatusOr<Event> RecordEvent(Channel& channel, const std::string& what) {
    cudaEvent_t event;
    if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        e != cudaSuccess) {
      return Fail(CudaError(e, what));
    }
    Event owned(event);
    if (cudaError_t e = cudaEventRecord(event, channel.stream); e != cudaSuccess) {
      return Fail(CudaError(e, what));
    }
    return owned;
  }

  absl::Status AwaitLaunch(Channel& channel, absl::Time deadline, const std::string& what) {
    return Poll(channel, deadline, what, []() -> absl::StatusOr<bool> { return true; });
  }

  absl::Status AwaitEvent(Channel& channel, cudaEvent_t event, absl::Time deadline,
                          const std::string& what) {
    return Poll(channel, deadline, what, [&]() -> absl::StatusOr<bool> {
      const cudaError_t state = QueryEvent(event);
      if (state == cudaSuccess) return true;
      if (state == cudaErrorNotReady) return false;
      return CudaError(state, what);
    });
  }

  // Polls until `done()` says true once NCCL has finished launching on `channel`. Fails with
  // the abort reason once aborted, and aborts the transport on a deadline, an NCCL error or a
  // failed `done()`: a kernel stuck waiting for a peer only stops with its communicator.
  absl::Status Poll(Channel& channel, absl::Time deadline, const std::string& what,
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

  absl::Status CudaError(cudaError_t error, const std::string& what) const {
    return absl::InternalError(
        absl::StrCat(Self(), ": CUDA failed while ", what, ": ", cudaGetErrorString(error)));
  }

  // Aborts the transport with `error` and returns the first abort reason.
  absl::Status Fail(const absl::Status& error) {
    Abort(error);
    return aborted();
  }

  absl::Status aborted() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return abort_reason_;
  }

  // Takes every communicator out of its channel (later calls on it fail with the abort
  // reason) and aborts them all at once.
  void AbortCommunicators() { AbortAll(TakeCommunicators()); }

  std::vector<ncclComm_t> TakeCommunicators() {
    std::lock_guard<std::mutex> lock(nccl_mu_);
    std::vector<ncclComm_t> comms;
    for (auto& channel : channels_) {
      if (channel->comm != nullptr) comms.push_back(channel->comm);
      channel->comm = nullptr;
    }
    return comms;
  }

  // ncclCommAbort blocks until the communicator's work has stopped, and that work may wait
  // (through stream ordering) for another communicator's: aborting them one at a time could
  // wait forever, so each gets its own thread. Called without nccl_mu_ held.
  void AbortAll(const std::vector<ncclComm_t>& comms) const {
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

  // Normal shutdown: ncclCommFinalize every communicator (NCCL completes what was issued and
  // waits for the peers to finalize theirs), poll until none is in progress, then
  // ncclCommDestroy. Those that fail, or are still finalizing at `deadline`, are aborted.
  void CloseCommunicators(absl::Time deadline) {
    std::vector<ncclComm_t> finalizing;
    std::vector<ncclComm_t> failed;
    for (ncclComm_t comm : TakeCommunicators()) {
      const ncclResult_t r = ncclCommFinalize(comm);
      (r == ncclSuccess || r == ncclInProgress ? finalizing : failed).push_back(comm);
    }
    for (;;) {
      for (auto it = finalizing.begin(); it != finalizing.end();) {
        ncclResult_t state;
        if (ncclResult_t r = ncclCommGetAsyncError(*it, &state); r != ncclSuccess) state = r;
        if (state == ncclInProgress) {
          ++it;
          continue;
        }
        if (state == ncclSuccess) {
          ncclCommDestroy(*it);
        } else {
          failed.push_back(*it);
        }
        it = finalizing.erase(it);
      }
      if (finalizing.empty() || absl::Now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    failed.insert(failed.end(), finalizing.begin(), finalizing.end());
    AbortAll(failed);
  }

  // Keeps `tensors` alive until the transport is destroyed (after its streams have
  // synchronized): a failed call's enqueued work may still read or write them.
  void Bury(std::vector<at::Tensor> tensors) {
    std::lock_guard<std::mutex> lock(graveyard_mu_);
    for (at::Tensor& t : tensors) {
      if (t.defined()) graveyard_.push_back(std::move(t));
    }
  }

  // REQUIRES: send_mu_ held.
  void Reap() {
    in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                    [](const InFlight& sent) {
                                      return QueryEvent(sent.done.get()) == cudaSuccess;
                                    }),
                     in_flight_.end());
  }

  std::shared_ptr<rendezvous::KeyValueStore> store_;
  NcclTransportOptions options_;
  std::vector<std::unique_ptr<Channel>> channels_;
  // Roles of channels_ (null where this stage has no such neighbour; in loopback, each kind's
  // out and in are the same channel).
  Channel* activations_out_ = nullptr;
  Channel* activations_in_ = nullptr;
  Channel* gradients_out_ = nullptr;
  Channel* gradients_in_ = nullptr;
  Channel* replicas_ = nullptr;  // null with one replica (outside loopback)
  std::mutex nccl_mu_;    // serializes NCCL calls against AbortCommunicators()
  std::mutex staged_mu_;  // guards Channel::staged
  std::mutex send_mu_;
  std::vector<InFlight> in_flight_;  // guarded by send_mu_
  std::mutex abort_mu_;
  absl::Status abort_reason_;  // guarded by abort_mu_
  std::mutex graveyard_mu_;
  std::vector<at::Tensor> graveyard_;  // guarded by graveyard_mu_; see Bury()
};

}  // namespace

bool CudaDeviceAvailable() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const NcclTransportOptions& options) {
  const int rank = options.replica * options.stages + options.stage;
  if (options.stages < 1 || options.replicas < 1 || options.stage < 0 ||
      options.stage >= options.stages || options.replica < 0 ||
      options.replica >= options.replicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no stage ", options.stage, " of replica ", options.replica, " in a job of ",
        options.stages, " stages and ", options.replicas, " replicas"));
  }
  if (options.loopback && (options.stages != 1 || options.replicas != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the NCCL loopback needs 1 stage and 1 replica, not ", options.stages, " and ",
        options.replicas));
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, ": no CUDA device: ", cudaGetErrorString(e)));
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank, ": no CUDA device ", options.device, " (", devices, " visible)"));
  }
  DeviceGuard device(options.device);
  auto transport = std::make_unique<NcclTransport>(std::move(store), options);
  if (absl::Status s = transport->Connect(); !s.ok()) {
    transport->Abort(s);  // so that destroying it aborts its communicators, not finalizes them
    return s;
  }
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace pipetrain::transport
