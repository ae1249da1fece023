// Stages as processes on GPUs: activations and gradients as CUDA tensors over NCCL.
//
// Built on the CUDA runtime API and NCCL alone, with no c10::cuda or ATen CUDA headers, so it
// compiles and links against a CPU-only LibTorch; it needs a CUDA LibTorch at run time only
// (received tensors are allocated with at::empty on the CUDA device).
//
// Rank layout as in the Gloo transport: process (stage s, replica r) of a p-stage pipeline is
// rank r*p + s, and uses CUDA device `options.device`, one process per GPU (NCCL refuses two
// ranks of one communicator on the same device).
//
// Communicators. NCCL point-to-point messages have no tags and a send waits for its matching
// receive, so sharing one communicator between both directions of a link could deadlock. Each
// link between adjacent stages therefore has two 2-rank communicators, one per direction
// (activations s -> s+1, gradients s+1 -> s), each with its own stream, so every communicator
// carries one-way traffic in schedule order. The w replicas of a stage share one more
// communicator for the gradient AllReduce. The lowest rank of each communicator creates its
// ncclUniqueId and publishes it in the store; the others wait for it at most
// `connect_timeout`. Every link exchanges one warm-up message while connecting, so NCCL's
// lazily made peer connections exist before the first real Send.
//
// Messages. Every message is a fixed-size int64 header (kind, micro-batch, dtype, ndim, dims;
// the Gloo transport's layout) sent as a small CUDA tensor, then the payload. A link delivers
// its messages in send order, so Recv must ask for them in that order (the executor asks in
// schedule order, which is the sender's order); the receiver checks each header's kind and
// micro-batch against what it asked for and fails with FailedPrecondition naming both on a
// mismatch, then allocates the payload with the header's real dtype and shape (the executor
// compares those with what it expected). Send takes CUDA tensors on `options.device` (made
// contiguous if they are not), AllReduce contiguous ones, of dtype float32, float64, float16,
// bfloat16, int64, int32 or uint8; anything else is InvalidArgument.
//
// Ordering with LibTorch's compute. The transport's streams are made with cudaStreamCreate,
// i.e. as BLOCKING streams: work enqueued on them waits for all work enqueued before on the
// legacy default stream, and later default-stream work waits for theirs. This assumes that
// LibTorch's current stream is the default stream (true unless the caller switches streams):
// a Send then reads its tensor only after the kernels that produced it, and the tensor
// returned by Recv or written by AllReduce is complete before any later kernel reads it. The
// transport itself never enqueues work on the default stream, and never blocks the host on it.
// The same rule means that whatever waits for the default stream or the device (.item(),
// .cpu(), cudaDeviceSynchronize) also waits for sends still in flight, i.e. for their
// receivers to ask for them.
//
// Waiting. Send never waits for the receiver: it enqueues on the link's stream, keeps the
// header and payload alive until a recorded CUDA event completes, and Flush(deadline) waits
// for every send. Communicators are non-blocking (config.blocking = 0), and every wait polls
// ncclCommGetAsyncError and cudaEventQuery with short sleeps until its deadline. A deadline
// gives DeadlineExceeded naming what waited for whom ("stage 1 (rank 1) timed out waiting for
// the activation of micro-batch 3 from stage 0 (rank 0)"); an NCCL error (e.g. a peer that
// died) gives Unavailable. Either one, a header mismatch, or Abort(reason) aborts every
// communicator (ncclCommAbort: the only way to stop a kernel waiting for a peer) and makes
// every pending and future call fail with the first reason. Destroying the transport aborts
// its communicators too: Flush() first.
//
// AllReduceMean / StartAllReduceMean: one ncclAllReduce with ncclAvg per tensor, in place,
// grouped, on the replicas' communicator; with one replica it only checks the tensors (except
// in loopback, below).
//
// Loopback (tests on one GPU): with `loopback`, a 1-stage, 1-replica transport is its own
// neighbour: Send(own stage, ...) and Recv(own stage, ...) travel over 1-rank communicators,
// and AllReduceMean really runs over a 1-rank communicator. NCCL requires a send to self to be
// issued in the same group as its receive, so Send only stages the message (header and
// payload kept alive) and the matching Recv copies the header to the GPU and issues each send
// together with its receive; everything else (headers, checks, allocation, streams, events,
// deadlines, Abort) is the code multi-GPU jobs run.
//
// Thread-safe for one sending, one receiving and one reducing thread at a time; Abort() may be
// called from any thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/transport.h"

namespace pipetrain::transport {

struct NcclTransportOptions {
  int stage = 0;
  int stages = 1;
  int replica = 0;
  int replicas = 1;
  int device = 0;  // the CUDA device this process's tensors live on
  absl::Duration connect_timeout = absl::Seconds(60);
  bool loopback = false;  // see "Loopback" above; needs stages == replicas == 1
};

// True if the CUDA runtime sees at least one device.
bool CudaDeviceAvailable();

// Creates this process's communicators, exchanging their ids through `store`. Blocks until
// every peer has connected or `connect_timeout` passes (DeadlineExceeded naming who did not).
absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const NcclTransportOptions& options);

}  // namespace pipetrain::transport
