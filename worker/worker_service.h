// The worker's gRPC face: WorkerService's commands, each refused (UNAUTHENTICATED, doing
// nothing) without the command key the worker registered with (only the coordinator has it),
// then handed to the worker's plain handlers (worker.h: Assign, StopRank, ScheduleCommand);
// and FetchLayerState, served from the survivors' state the worker holds (held_state.h) to
// calls that carry that hold's key.
//
// FetchLayerState is served with gRPC's callback API on raw bytes: no thread per call, the
// key checked before anything else is looked at, each chunk a slice of the held bytes
// themselves (no copy; the slice keeps them alive until gRPC has sent it), and at most
// kMaxFetches served at once (more: RESOURCE_EXHAUSTED at once, the fetcher tries another
// holder or again). A refusal for the key (PERMISSION_DENIED) is answered kRefusalDelay
// late, on an alarm (at most kMaxDelayedRefusals at once; beyond, at once): a client that
// calls without the key in a loop makes a few calls a second per stream, where gRPC's own
// cost of a call (50-70 µs of CPU, bench/fetch_flood.py) let a few clients take most of a
// core with thousands a second. So a flood of fetches, with or without the key, costs the
// worker neither threads nor memory beyond these bounds.
//
// No state but the counts of fetches and delayed refusals in flight; thread-safe as the worker is.
// The worker and the held states outlive it.
#pragma once

#include <atomic>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "worker/held_state.h"

namespace pipetrain::worker {

class Worker;

class WorkerServiceAdapter final
    : public v1::WorkerService::WithRawCallbackMethod_FetchLayerState<v1::WorkerService::Service> {
 public:
  WorkerServiceAdapter(Worker* worker, std::string command_key, const HeldStates* held)
      : worker_(worker), command_key_(std::move(command_key)), held_(held) {}

  grpc::Status AssignStage(grpc::ServerContext* context, const v1::StageAssignment* request,
                           v1::AssignResponse*) override;
  grpc::Status StopStage(grpc::ServerContext* context, const v1::StopStageRequest* request,
                         v1::AssignResponse*) override;
  grpc::Status ScheduleCommand(grpc::ServerContext* context, const v1::SendCommandRequest* request,
                               v1::SendCommandResponse* response) override;
  // OK to the coordinator (it asks before another registration takes this address over).
  grpc::Status Ping(grpc::ServerContext* context, const v1::PingRequest* request,
                    v1::PingResponse* response) override;
  // The layer's bytes as LayerStateChunk messages of kLayerChunkBytes (the request and the
  // chunks as their protobuf wire bytes).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchLayerState(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  static constexpr size_t kLayerChunkBytes = 1 << 20;
  static constexpr int kMaxFetches = 4;
  static constexpr absl::Duration kRefusalDelay = absl::Milliseconds(250);
  static constexpr int kMaxDelayedRefusals = 256;
  // Fetches being served now.
  int fetches_in_flight() const { return fetches_.load(); }

 private:
  // OK if the call carries the command key, else UNAUTHENTICATED.
  grpc::Status RefuseWithoutCommandKey(const grpc::ServerContext& context) const;

  Worker* const worker_;
  const std::string command_key_;
  const HeldStates* const held_;
  std::atomic<int> fetches_{0};
  std::atomic<int> delayed_refusals_{0};
};

}  // namespace pipetrain::worker
