// The data plane seen by one pipeline stage of one data-parallel replica: point-to-point
// tensors to and from the neighbouring stages of its pipeline, and the gradient AllReduce
// among the replicas of the stage.
//
// Messages are addressed by (peer stage, kind, micro-batch), so the order in which a peer
// sends does not matter. Send never blocks on the receiver. Recv blocks until the message
// arrives, the deadline passes (DeadlineExceeded naming what waited for whom) or the
// transport is aborted (the abort reason, so every stage of a failing job stops with the
// first error). Implementations: in_process/ (stages as threads of one process), gloo/
// (stages as processes, over TCP).
// Thread-safe: Abort() may be called from any thread while Send/Recv run.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pipetrain::transport {

// Activations flow to the next stage, gradients to the previous one; control messages (the
// step commands of a boundary, runtime/control) flow like activations, indexed by step; a
// tied parameter's gradient goes between the ranks holding its copies (any two); under
// vertical sync a micro-batch's weight version follows its activation, indexed by micro-batch.
enum class MessageKind {
  kActivation,
  kGradient,
  kControl,
  kTiedGradient,
  kWeightVersion,
  kGradientNorm,    // a rank's part of the pipeline's gradient norm (clipping), keyed by step
  kEvalActivation,  // an evaluated micro-batch's activation (evaluation on held-out data)
  kStepCommit,      // a rank holds a step's final gradient (the step commit), keyed by step
  kEvalProgress,    // a rank has evaluated a micro-batch (to the rank that sent it its input)
};

// "activation" / "gradient" / "control".
const char* MessageKindName(MessageKind kind);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int stage() const = 0;
  // Sends `tensor` (see the file comment) and, once it is on its way, counts its payload.
  absl::Status Send(int peer_stage, MessageKind kind, int64_t micro_batch,
                    const at::Tensor& tensor);
  virtual absl::StatusOr<at::Tensor> Recv(int peer_stage, MessageKind kind, int64_t micro_batch,
                                          absl::Time deadline) = 0;
  // Fails every pending and future Send/Recv of every stage sharing this data plane with
  // `reason`. The first reason wins. (Across processes, peers learn of it when this
  // process exits and its connections close.)
  virtual void Abort(const absl::Status& reason) = 0;
  // Averages `tensors` in place across the data-parallel replicas of this stage. Every
  // replica calls it the same number of times with the same shapes, in the same order.
  // With one replica it does nothing.
  virtual absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) = 0;
  // Starts averaging `tensors` across the replicas (same contract as AllReduceMean); the
  // result is written into them when the returned reduction's Wait() succeeds. The default
  // does it all at once, before returning.
  class PendingReduction {
   public:
    virtual ~PendingReduction() = default;
    virtual absl::Status Wait(absl::Time deadline) = 0;
  };
  virtual std::unique_ptr<PendingReduction> StartAllReduceMean(std::vector<at::Tensor> tensors,
                                                               absl::Time deadline);
  // Waits until every message sent so far has left this process (before exiting).
  virtual absl::Status Flush(absl::Time /*deadline*/) { return absl::OkStatus(); }

  // The payload bytes (the tensors' elements, not the transport's headers) of every message
  // Send has put on its way so far, and how many messages. Thread-safe.
  int64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  int64_t messages_sent() const { return messages_sent_.load(std::memory_order_relaxed); }

 protected:
  // What Send does, in each implementation.
  virtual absl::Status SendMessage(int peer_stage, MessageKind kind, int64_t micro_batch,
                                   const at::Tensor& tensor) = 0;

 private:
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> messages_sent_{0};
};

// Shape and dtype a message must have, checked by the receiver.
struct TensorSpec {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  std::string ToString() const;  // "float32[8, 32, 64]"
};

TensorSpec SpecOf(const at::Tensor& tensor);
// Bytes of one element of the dtype numbered `dtype` (at::ScalarType) if a transport carries
// it (integers, bool, half, bfloat16, float, double, complex), else 0: the ElementSizeOf of
// wire_header.h.
int64_t WireElementSize(int64_t dtype);
bool Matches(const TensorSpec& spec, const at::Tensor& tensor);

}  // namespace pipetrain::transport
