// The coordinator's calls to one worker (pipetrain.v1.WorkerService): assign a stage, stop a
// stage, hand over a step command, ask whether it is still there. Every call carries the
// worker's command key (rpc/security.h), has a deadline and is made off the coordinator's
// lock. Injected, so that the coordinator's rules are unit-tested with a fake
// worker that records calls and fails them on demand (tests/coordinator).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "pipetrain/v1/worker_service.pb.h"
#include "rpc/security.h"

namespace pipetrain::coordinator {

class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual absl::Status AssignStage(const v1::StageAssignment& assignment) = 0;
  virtual absl::Status StopStage(const v1::StopStageRequest& request) = 0;
  virtual absl::StatusOr<v1::SendCommandResponse> ScheduleCommand(
      const v1::SendCommandRequest& request) = 0;
  // OK while the worker this client was made for still serves at its address (2 s deadline):
  // another process there, or none, answers otherwise.
  virtual absl::Status Ping() = 0;
};

// Makes the client of the worker serving at `address` that registered with `command_key`
// (no call is made yet).
using WorkerConnector = std::function<absl::StatusOr<std::shared_ptr<WorkerClient>>(
    const std::string& address, const std::string& command_key)>;

// Clients over gRPC with `security` (token and TLS), 10 s deadline for an assignment, 2 s
// for a ping and 5 s for the rest.
WorkerConnector GrpcWorkerConnector(const rpc::SecurityOptions& security);

}  // namespace pipetrain::coordinator
