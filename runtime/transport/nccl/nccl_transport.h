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
// receive, so sharing one communicator between both directions of a link could deadlock, and
// two boundaries between the same two ranks (schedules with chunks: interleaved's wrap from the
// last rank to the first, ZB-V's and DualPipeV's way back) could not be told apart. Each
// pipeline boundary (model stage m to m + 1 on different ranks: transport.h's message numbers
// say which) therefore has two 2-rank communicators, one per direction (activations and control
// messages forward, gradients back), each with its own stream, so every communicator carries
// one-way traffic in schedule order; with `evaluation_links`, the evaluation's messages have
// two more of their own per boundary, since under 2BW and PipeDream a rank sends the next
// step's activations before its evaluation's and a shared link would deliver them out of the
// receiver's order. The p stages of a replica's pipeline share one communicator for the
// collectives among them, and the w replicas of a stage one more for the gradient AllReduce and
// the collectives among them. The sending rank (the lowest rank of a group's communicator)
// creates its ncclUniqueId and publishes it in the store; the others wait for it at most
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
// Ordering with LibTorch's compute. The transport's streams are non-blocking
// (cudaStreamNonBlocking), so CUDA orders nothing between them and the legacy default stream,
// either way; the transport orders explicitly. Before it enqueues work on a stream (a Send's
// header upload and sends, a receive, the warm-up, an AllReduce) it records an event on the
// legacy default stream (cudaStreamLegacy) and makes the stream wait for it (legacy-default-
// stream event -> transport stream), so that work starts only after every kernel enqueued
// before it on the default stream: those that produced the tensors it sends or reduces, and
// those that last used the memory the caching allocator has just handed it to receive into.
// The other way round needs no event because the host waits: Recv returns, and a reduction's
// Wait succeeds, only once the work has completed, so later kernels see the result. This
// assumes LibTorch's current stream is the default stream (true unless the caller switches
// streams). The transport's work never delays compute: no default-stream kernel waits for it,
// so .item(), .cpu() and the kernels after a Send run however long its receiver takes to ask,
// and the backward overlaps the AllReduce. In exchange, a sent tensor is not copied, only kept
// alive until its send completes: do not modify it in place before Flush; nor use the tensors
// of a pending reduction before its Wait returns. Device-wide synchronizations
// (cudaDeviceSynchronize, or the cudaFree the caching allocator calls when it must release
// cached memory, e.g. to retry an allocation that ran out of memory) still wait for the
// transport's streams, i.e. for sends whose receivers have not asked yet. The transport
// enqueues work on the default stream only through LibTorch: Send's contiguous() launches a
// copy there for a non-contiguous tensor, and connecting fills its warm-up token with
// at::zeros there (at::empty enqueues nothing); plus the event records above. It never blocks
// the host on the default stream.
//
// Waiting. Send never waits for the receiver: it enqueues on the link's stream, keeps the
// header and payload alive until a recorded CUDA event completes, and Flush(deadline) waits
// for every send. Communicators are non-blocking (config.blocking = 0), and every wait polls
// ncclCommGetAsyncError and cudaEventQuery with short sleeps until its deadline. A deadline
// gives DeadlineExceeded naming what waited for whom ("stage 1 (rank 1) timed out waiting for
// the activation of micro-batch 3 from stage 0 (rank 0)"); an NCCL error (e.g. a peer that
// died) gives Unavailable. Either one, a header mismatch, or Abort(reason) aborts every
// communicator (ncclCommAbort: the only way to stop a kernel waiting for a peer) and makes
// every pending and future call fail with the first reason. ncclCommAbort blocks until the
// communicator's work has stopped, and that work may wait (through stream ordering) for
// another communicator's, so the communicators are aborted concurrently, one thread each. The
// buffers of a call that failed after enqueueing work, and the tensors of a pending reduction
// dropped before it completed, are kept until the transport is destroyed, since that work may
// still read or write them.
//
// Destroying the transport. A healthy one (never aborted) finalizes its communicators
// (ncclCommFinalize: NCCL completes what was issued, sends not yet flushed included, which
// needs the peers to receive them and finalize theirs), waiting at most 10 s in all, then
// destroys them; a failed or aborted one, or one whose communicators do not finish finalizing
// in time, aborts them, and sends not yet delivered die. Either way it then waits for its
// streams before freeing the tensors their work used. Flush() first to know that every send
// arrived. Pending reductions must not outlive their transport.
//
// AllReduceMean / StartAllReduceMean: one ncclAllReduce with ncclAvg per tensor, in place,
// grouped, on the replicas' communicator; with one replica it only checks the tensors (except
// in loopback, below). AllGather: one ncclAllGather on the pipeline's or the replicas'
// communicator; among some stages of the pipeline, one grouped ncclSend and ncclRecv to and
// from each other member on the pipeline's communicator (the other stages issue nothing). It
// waits for its event before it returns, like Recv.
//
// Loopback (tests on one GPU): with `loopback`, a 1-stage, 1-replica transport is its own
// neighbour: Send(own stage, ...) and Recv(own stage, ...) travel over 1-rank communicators,
// and AllReduceMean and AllGather among the replicas really run over a 1-rank communicator. NCCL
// requires a send to self to be issued in the same group as its receive, so Send only stages the
// message (header and payload kept alive) and the matching Recv copies the header to the GPU and
// issues each send together with its receive (so Flush has nothing to wait for); everything else
// (headers, checks, allocation, streams, events, deadlines, Abort) is the code multi-GPU jobs run.
//
// Thread-safe for one sending, one receiving and one reducing thread (the gradient AllReduce
// and the collectives) at a time; Abort() may be called from any thread.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/transport.h"

namespace pipetrain::transport {

struct NcclTransportOptions : TransportOptions {
  int device = 0;                 // the CUDA device this process's tensors live on
  bool loopback = false;          // see "Loopback" above; needs stages == replicas == 1
  bool evaluation_links = false;  // the job evaluates: links for its messages (above)
};

// True if the CUDA runtime sees at least one device.
bool CudaDeviceAvailable();

// Creates this process's communicators, exchanging their ids through `store`. Blocks until
// every peer has connected or `connect_timeout` passes (DeadlineExceeded naming who did not).
absl::StatusOr<std::unique_ptr<Transport>> MakeNcclTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const NcclTransportOptions& options);

}  // namespace pipetrain::transport
