// The data plane seen by one pipeline stage of one data-parallel replica: point-to-point
// tensors to and from the neighbouring model stages of its pipeline, and collectives among a
// group of ranks (its pipeline, some of its pipeline's stages, or its stage's replicas).
//
// Messages are addressed by (peer stage, kind, number), so the order in which a peer
// sends does not matter. Send never blocks on the receiver. Recv blocks until the message
// arrives, the deadline passes (DeadlineExceeded naming what waited for whom) or the
// transport is aborted (the abort reason, so every stage of a failing job stops with the
// first error). A message travels across one pipeline boundary (between model stages m and
// m + 1, on different ranks), and its number says which: it is n x v + c, where v is the
// number of model stages a rank holds and c = floor(m / p) (schedule::ChunkLayout's
// MessageNumber and MicroBatchOfMessage; with one model stage a rank, just n). Implementations:
// in_process/ (stages as threads of one process), gloo/ (stages as processes, over TCP), nccl/
// (stages as processes on GPUs).
//
// Collectives (AllGather, AllReduce, Broadcast, Barrier) run among the members of a Group;
// every member calls the same collectives on that group in the same order, with tensors of the
// same shapes and dtype. Their results are the same on every member to the bit and do not
// depend on the implementation: members' tensors are combined in member order (ascending
// stage or replica). Each has a deadline and ends like a Recv: DeadlineExceeded naming the
// group, the abort reason once aborted, Unavailable when a member is lost.
// Thread-safe: Abort() may be called from any thread while Send/Recv/collectives run; each
// implementation says which calls may overlap.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/base/rank_layout.h"

namespace pipetrain::transport {

// What travels between neighbouring model stages. Towards the later model stage: activations,
// control messages (the step commands of a boundary, runtime/control, numbered by step), a
// micro-batch's weight version under vertical sync, and evaluated activations. Towards the
// earlier one: gradients, and the evaluation's progress (a rank has evaluated a micro-batch:
// to the rank that sent it its input).
enum class MessageKind {
  kActivation,
  kGradient,
  kControl,
  kWeightVersion,
  kEvalActivation,
  kEvalProgress,
};
inline constexpr MessageKind kMessageKinds[] = {
    MessageKind::kActivation,    MessageKind::kGradient,       MessageKind::kControl,
    MessageKind::kWeightVersion, MessageKind::kEvalActivation, MessageKind::kEvalProgress};

// True for the kinds that travel towards the later model stage.
bool FlowsForward(MessageKind kind);
// True for the kinds of the evaluation on held-out data.
bool IsEvaluation(MessageKind kind);

// "activation" / "gradient" / "control message" ...
const char* MessageKindName(MessageKind kind);

// The ranks a collective runs among, numbered in ascending order.
class Group {
 public:
  // Every stage of this replica's pipeline.
  static Group Pipeline() { return Group(false, {}); }
  // The given stages of this replica's pipeline (ascending and distinct; the caller's own
  // among them).
  static Group PipelineStages(std::vector<int> stages) { return Group(false, std::move(stages)); }
  // The data-parallel replicas of this stage.
  static Group Replicas() { return Group(true, {}); }

  bool replicas() const { return replicas_; }
  // The pipeline's stages in the group; empty for Pipeline() and Replicas().
  const std::vector<int>& stages() const { return stages_; }
  // "the pipeline", "stages 0, 3 of the pipeline", "the replicas".
  std::string ToString() const;

 private:
  Group(bool replicas, std::vector<int> stages) : replicas_(replicas), stages_(std::move(stages)) {}
  bool replicas_;
  std::vector<int> stages_;
};

enum class ReduceOp { kSum, kMax };

// Where a stage process's transport sits in its job: what every transport between processes
// is told. Process (stage s, replica r) of a p-stage pipeline is rank r x p + s (RankLayout).
struct TransportOptions {
  int stage = 0;
  int stages = 1;
  int replica = 0;
  int replicas = 1;
  absl::Duration connect_timeout = absl::Seconds(60);
  // The stage of the pipeline that holds each model stage, in model order (runtime/schedule's
  // ChunkLayout::RankOf); empty: model stage s on stage s. With v model stages a rank, two
  // ranks may share several boundaries (see the file comment's message numbers).
  std::vector<int> model_stage_holders;

  RankLayout layout() const { return {stages, replicas}; }
  int rank() const { return layout().RankOf(stage, replica); }
  // v: model stages a rank holds.
  int chunks_per_rank() const;
  // "stage 1 (rank 5)": a stage of this process's replica.
  std::string Describe(int pipeline_stage) const;
  // InvalidArgument unless stage, replica and model_stage_holders fit the layout.
  absl::Status Validate() const;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int stage() const = 0;
  // Where the tensors it carries live: the CPU, or the CUDA device of the NCCL transport.
  virtual c10::Device device() const { return c10::Device(c10::DeviceType::CPU); }
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
  // Every member's `mine` (same shape and dtype on all), in member order.
  virtual absl::StatusOr<std::vector<at::Tensor>> AllGather(const Group& group,
                                                            const at::Tensor& mine,
                                                            absl::Time deadline) = 0;
  // Combines `tensors` in place across the members (all of one dtype): their sum or elementwise
  // maximum, taken in member order, so the same on every member to the bit.
  absl::Status AllReduce(const Group& group, std::vector<at::Tensor>& tensors, ReduceOp op,
                         absl::Time deadline);
  // Every member's `tensors` become member `root`'s (its stage, or its replica index). Made of
  // AllGathers (every member's tensors reach every other): for small tensors.
  absl::Status Broadcast(const Group& group, std::vector<at::Tensor>& tensors, int root,
                         absl::Time deadline);
  // Returns once every member has called it.
  absl::Status Barrier(const Group& group, absl::Time deadline);

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
