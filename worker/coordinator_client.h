// What a worker asks of its coordinator (CoordinatorService), one method per call: the seam
// between the worker's rules and gRPC. The gRPC implementation (the mirror of the
// coordinator's worker_client.h) sends every call over the worker's channel, which carries
// its token and its session, with the deadline each method states; tests put a fake behind
// the interface that can lose a request or its reply.
//
// Errors are the calls' statuses: UNAVAILABLE or DEADLINE_EXCEEDED when no answer came (the
// call may or may not have been applied: callers resend, and the coordinator skips what it
// has counted), NOT_FOUND when the coordinator no longer knows the worker's session (it
// restarted: register again), UNAUTHENTICATED or PERMISSION_DENIED for a refused token.
// Implementations are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "runtime/rendezvous/key_value_store.h"

namespace pipetrain::worker {

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  // 5 s.
  virtual absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) = 0;
  // Waits at most `deadline` for the answer, which goes to `response` (not null).
  virtual absl::Status Heartbeat(const v1::HeartbeatRequest& request, absl::Duration deadline,
                                 v1::HeartbeatResponse* response) = 0;
  // 5 s.
  virtual absl::StatusOr<v1::ReportResponse> ReportSteps(const v1::StepReports& reports) = 0;
  virtual absl::Status ReportStageEnd(const v1::StageEnd& end, absl::Duration deadline) = 0;
  // 5 s.
  virtual absl::StatusOr<v1::DrainWorkerResponse> Drain(const v1::DrainWorkerRequest& request) = 0;
  // 1 s.
  virtual absl::Status Deregister(const v1::DeregisterWorkerRequest& request) = 0;
  // A stopped rank's state (survivor_handoff.h); waits at most `deadline`.
  virtual absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const v1::StoppedRank& stopped,
                                                                absl::Duration deadline) = 0;
  // The rendezvous store of job `job_id`'s ranks of `generation`, kept by the coordinator
  // (its KV RPCs; refused once that generation has ended).
  virtual std::shared_ptr<rendezvous::KeyValueStore> JobStore(const std::string& job_id,
                                                              int generation) = 0;
};

// Calls through `stub` (its channel carries the token and the worker's session).
std::shared_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(
    std::shared_ptr<v1::CoordinatorService::Stub> stub);

}  // namespace pipetrain::worker
