// The NCCL transport's class, shared by its source files: connecting and closing
// (nccl_transport.cc), messages (nccl_messages.cc), reductions and collectives
// (nccl_reduction.cc), issuing NCCL work and waiting for it (nccl_streams.cc), and aborting
// (nccl_failure.cc). Made only by
// MakeNcclTransport; nccl_transport.h is its contract (threads, ordering, waiting, errors,
// what a failed call keeps alive). Lock order: send_mu_ before nccl_mu_ before abort_'s;
// staged_mu_ and graveyard_mu_ are held only while their own fields are touched.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/abort_latch.h"
#include "runtime/transport/boundary_links.h"
#include "runtime/transport/nccl/nccl_cuda.h"
#include "runtime/transport/nccl/nccl_transport.h"
#include "runtime/transport/transport.h"
#include "runtime/transport/wire_header.h"

namespace pipetrain::transport::nccl {

inline constexpr int kMaxDims = kWireMaxDims;
inline constexpr int kHeaderSize = kWireHeaderWords;  // wire_header.h (the inline flag always 0)
inline constexpr size_t kHeaderBytes = kHeaderSize * sizeof(int64_t);
inline constexpr auto kPollInterval = std::chrono::microseconds(50);
// How long destroying a healthy transport waits for its communicators to finalize.
inline constexpr absl::Duration kFinalizeTimeout = absl::Seconds(10);

// A message being sent: its header (filled on the host, copied to the GPU on the link's
// stream) and its contiguous payload, all kept alive until NCCL has sent them.
struct Message {
  at::Tensor header_host;  // pinned
  at::Tensor header;
  at::Tensor payload;
};

// One NCCL communicator with its own stream.
struct Channel {
  enum class Role { kSend, kReceive, kLoopback, kCollective };
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
  ~NcclTransport() override;

  // Creates the channels, exchanges their ids, initializes the communicators and sends one
  // warm-up message over every link. REQUIRES: the current device is options_.device.
  absl::Status Connect();

  int stage() const override { return options_.stage; }

  absl::Status SendMessage(int peer, MessageKind kind, int64_t micro_batch,
                           const at::Tensor& tensor) override;

  absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t micro_batch,
                                  absl::Time deadline) override;

  absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) override;

  // One grouped ncclAllReduce (ncclAvg) per tensor, in place; Wait() waits for its event.
  std::unique_ptr<PendingReduction> StartAllReduceMean(std::vector<at::Tensor> tensors,
                                                       absl::Time deadline) override;

  absl::StatusOr<std::vector<at::Tensor>> AllGather(const Group& group, const at::Tensor& mine,
                                                    absl::Time deadline) override;

  c10::Device device() const override {
    return c10::Device(c10::DeviceType::CUDA, options_.device);
  }

  void Abort(const absl::Status& reason) override;

  absl::Status Flush(absl::Time deadline) override;

 private:
  struct NcclReduction : public PendingReduction {
    NcclReduction(NcclTransport* owner, std::vector<at::Tensor> tensors)
        : owner(owner), tensors(std::move(tensors)) {}
    // Dropped before its reduction completed: the tensors live on until the transport dies.
    ~NcclReduction() override;
    absl::Status Wait(absl::Time deadline) override;
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

  int RankOf(int stage) const { return options_.layout().RankOf(stage, options_.replica); }
  std::string Describe(int stage) const { return options_.Describe(stage); }
  std::string Self() const { return Describe(options_.stage); }
  std::string ReductionWhat() const {
    return absl::StrCat("averaging gradients among the ", options_.replicas, " replicas of stage ",
                        options_.stage);
  }
  at::TensorOptions CudaOptions(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(at::kCUDA, options_.device);
  }

  // --- Connecting (nccl_transport.cc).

  Channel* AddChannel(Channel::Role role, std::string name, std::string key, int ranks, int rank,
                      int peer);

  // The links of every boundary this stage sends or receives across (both directions, and
  // the evaluation's with evaluation_links).
  void AddLinks();

  // Every creator publishes its ids before anyone waits, so no process waits for an id that
  // a waiting process has yet to publish.
  absl::StatusOr<std::vector<ncclUniqueId>> ExchangeIds(absl::Time deadline);

  // One message over every link, so that NCCL makes its peer connections here rather than in
  // the first Send (whose launch would then wait for the receiver).
  absl::Status WarmUpLinks(absl::Time deadline);

  // Normal shutdown: ncclCommFinalize every communicator (NCCL completes what was issued and
  // waits for the peers to finalize theirs), poll until none is in progress, then
  // ncclCommDestroy. Those that fail, or are still finalizing at `deadline`, are aborted.
  void CloseCommunicators(absl::Time deadline);

  // --- Messages (nccl_messages.cc).

  // The channel that carries message `number` of `kind` to (sending) or from `peer`: the link
  // of its boundary (the number's chunk, transport.h), direction and lane (training or
  // evaluation); in loopback, each direction's one link to this stage itself.
  Channel* Link(int peer, MessageKind kind, int64_t number, bool sending) const;

  absl::Status CheckTensor(const at::Tensor& tensor, const std::string& doing) const;

  // Receives into `buffer` (in loopback, sending `loopback_source` into it), then copies it to
  // the pinned `host` tensor if given; returns when all of it has completed. On a failure the
  // caller keeps the tensors alive (Bury): the receive and the copy may still be queued.
  absl::Status Receive(Channel& channel, const at::Tensor* loopback_source,
                       const at::Tensor& buffer, const at::Tensor* host, absl::Time deadline,
                       const std::string& what);

  absl::Status UploadHeader(Channel& channel, const Message& message, const std::string& what);

  // Drops the sends that have completed. REQUIRES: send_mu_ held.
  void Reap();

  // --- Reductions and collectives (nccl_reduction.cc).

  absl::Status StartReduction(NcclReduction& reduction, absl::Time deadline);

  // --- Issuing NCCL work and waiting for it (nccl_streams.cc).

  // Issues the NCCL calls of `calls` as one group on `channel`'s communicator. The caller then
  // waits for the launch (AwaitLaunch) before enqueueing anything else on the channel's stream.
  absl::Status IssueGroup(Channel& channel, const std::string& what,
                          absl::FunctionRef<ncclResult_t(ncclComm_t)> calls);

  // Sends `outgoing` to and/or receives `incoming` from `channel`'s peer; both at once only in
  // loopback, where NCCL requires a rank's send to itself to share a group with its receive.
  absl::Status Issue(Channel& channel, const at::Tensor* outgoing, const at::Tensor* incoming,
                     const std::string& what);

  // Makes `channel`'s stream wait for everything enqueued so far on the legacy default stream
  // (LibTorch's compute): the kernels that produced what the transport is about to read, and
  // those that last used memory the caching allocator has just handed out for it to write (a
  // freed block is reused at once, in default-stream order). Call it after allocating and
  // before enqueueing.
  absl::Status FollowCompute(Channel& channel, const std::string& what);

  absl::StatusOr<Event> RecordEvent(Channel& channel, const std::string& what);

  absl::Status AwaitLaunch(Channel& channel, absl::Time deadline, const std::string& what);

  absl::Status AwaitEvent(Channel& channel, cudaEvent_t event, absl::Time deadline,
                          const std::string& what);

  // Polls until `done()` says true once NCCL has finished launching on `channel`. Fails with
  // the abort reason once aborted, and aborts the transport on a deadline, an NCCL error or a
  // failed `done()`: a kernel stuck waiting for a peer only stops with its communicator.
  absl::Status Poll(Channel& channel, absl::Time deadline, const std::string& what,
                    absl::FunctionRef<absl::StatusOr<bool>()> done);

  absl::Status CudaError(cudaError_t error, const std::string& what) const;

  // --- Failing and aborting (nccl_failure.cc).

  // Aborts the transport with `error` and returns the first abort reason.
  absl::Status Fail(const absl::Status& error);

  // The first abort reason; OK while the transport is healthy.
  absl::Status aborted();

  // Takes every communicator out of its channel (later calls on it fail with the abort
  // reason) and aborts them all at once.
  void AbortCommunicators();

  std::vector<ncclComm_t> TakeCommunicators();

  // ncclCommAbort blocks until the communicator's work has stopped, and that work may wait
  // (through stream ordering) for another communicator's: aborting them one at a time could
  // wait forever, so each gets its own thread. Called without nccl_mu_ held.
  void AbortAll(const std::vector<ncclComm_t>& comms) const;

  // Keeps `tensors` alive until the transport is destroyed (after its streams have
  // synchronized): a failed call's enqueued work may still read or write them.
  void Bury(std::vector<at::Tensor> tensors);

  std::shared_ptr<rendezvous::KeyValueStore> store_;
  NcclTransportOptions options_;
  std::vector<std::unique_ptr<Channel>> channels_;
  // Roles of channels_. The pipeline's links (boundary_links.h), and the channel of each one
  // this stage sends or receives on, by its index there; in loopback, one link per direction,
  // each its own out and in.
  std::vector<BoundaryLink> links_;
  std::map<int, Channel*> link_channels_;
  Channel* loopback_forward_ = nullptr;
  Channel* loopback_backward_ = nullptr;
  Channel* pipeline_ = nullptr;  // null with one stage
  Channel* replicas_ = nullptr;  // null with one replica (outside loopback)
  std::mutex nccl_mu_;           // serializes NCCL calls against AbortCommunicators()
  std::mutex staged_mu_;         // guards Channel::staged
  std::mutex send_mu_;
  std::vector<InFlight> in_flight_;  // guarded by send_mu_
  AbortLatch abort_;                 // its lock a leaf, after every other
  std::mutex graveyard_mu_;
  std::vector<at::Tensor> graveyard_;  // guarded by graveyard_mu_; see Bury()
};

}  // namespace pipetrain::transport::nccl
