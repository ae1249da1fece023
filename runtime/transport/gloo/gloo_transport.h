// Stages as processes: activations and gradients over Gloo's TCP transport.
//
// Built on LibTorch's c10d::ProcessGroupGloo rather than Debian's bare libgloo: it brings
// the rendezvous over a key-value store, tagged point-to-point send/recv with timeouts and
// the ring AllReduce that data-parallel replicas need, all maintained with LibTorch and the
// same shape as the NCCL process group used on GPUs.
//
// Process (stage s, replica r) of a p-stage pipeline is rank r*p + s. Collectives: among
// the stages of this replica's pipeline (all or some), each member's tensor sent straight to
// every other on a process group of the pipeline (made when p > 1); among this stage's
// replicas, Gloo's allgather on their group (w > 1). Every message is a
// small header (kind, micro-batch, dtype, shape) with the payload, so the receiver learns
// the real shape and dtype of what arrived and the executor can reject a mismatch with
// both in the error. The receives of each peer's next few headers are posted ahead;
// payloads up to 128 KiB travel inline with the header (no round trip to ask for them),
// larger ones as a second message. Sends are asynchronous: a thread of the transport waits for
// each to be delivered and then drops it, so a sent tensor is held only until its peer has
// it; Flush() waits for all of them.
// Receives wait until their deadline; a peer that exits makes them fail at once
// (Unavailable naming the peer's stage and rank). Thread-safe for one sending, one receiving
// and one thread calling collectives.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/transport.h"

namespace pipetrain::transport {

// The receives posted ahead for a peer's messages of one kind are for the numbers n + k x v
// (k = 1 ..; v = chunks_per_rank(), transport.h's message numbers): posted for numbers that
// never come they would stay.
struct GlooTransportOptions : TransportOptions {
  std::string host = "127.0.0.1";  // address this process listens on for its peers
  // A collective is waited for in slices of this length, so that an Abort() ends the wait
  // (a collective's work cannot be aborted). Tests make it tiny to make races common.
  absl::Duration reduction_wait_slice = absl::Milliseconds(50);
};

// Bytes of receive buffers the transport keeps posted for each peer and kind of message it
// receives from (the headers posted ahead, each with room for an inline payload): what a
// stage holds besides its tensors for every neighbour that sends to it.
int64_t GlooPostedReceiveBytes();
// Received payloads of at most half this many bytes are copied out of their receive buffer;
// larger ones up to this size are handed out in it (the tensor keeps the whole buffer).
int64_t GlooInlinePayloadBytes();

// Connects to every other process of the job through `store` (c10d TCP store). Blocks until
// all have arrived or the timeout passes (naming who did not). The first call makes the
// process ignore SIGPIPE (unless it has a handler of its own): a write to a peer that died
// is an error of the transport, not the end of the process.
absl::StatusOr<std::unique_ptr<Transport>> MakeGlooTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, const GlooTransportOptions& options);

}  // namespace pipetrain::transport
