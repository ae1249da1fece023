#include "worker/coordinator_client.h"

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "rpc/status.h"
#include "worker/coordinator_store.h"

namespace pipetrain::worker {
namespace {

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(std::shared_ptr<v1::CoordinatorService::Stub> stub)
      : stub_(std::move(stub)) {}

  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) override {
    return Call(&v1::CoordinatorService::Stub::RegisterWorker, request,
                v1::RegisterWorkerResponse(), absl::Seconds(5));
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, absl::Duration deadline,
                         v1::HeartbeatResponse* response) override {
    absl::StatusOr<v1::HeartbeatResponse> r =
        Call(&v1::CoordinatorService::Stub::Heartbeat, request, v1::HeartbeatResponse(), deadline);
    if (!r.ok()) return r.status();
    *response = *std::move(r);
    return absl::OkStatus();
  }
  absl::StatusOr<v1::ReportResponse> ReportSteps(const v1::StepReports& reports) override {
    return Call(&v1::CoordinatorService::Stub::ReportSteps, reports, v1::ReportResponse(),
                absl::Seconds(5));
  }
  absl::Status ReportStageEnd(const v1::StageEnd& end, absl::Duration deadline) override {
    return Call(&v1::CoordinatorService::Stub::ReportStageEnd, end, v1::ReportResponse(), deadline)
        .status();
  }
  absl::StatusOr<v1::DrainWorkerResponse> Drain(const v1::DrainWorkerRequest& request) override {
    return Call(&v1::CoordinatorService::Stub::DrainWorker, request, v1::DrainWorkerResponse(),
                absl::Seconds(5));
  }
  absl::Status Deregister(const v1::DeregisterWorkerRequest& request) override {
    return Call(&v1::CoordinatorService::Stub::DeregisterWorker, request,
                v1::DeregisterWorkerResponse(), absl::Seconds(1))
        .status();
  }
  absl::StatusOr<v1::SurvivorInstruction> ReportStopped(const v1::StoppedRank& stopped,
                                                        absl::Duration deadline) override {
    return Call(&v1::CoordinatorService::Stub::ReportStopped, stopped, v1::SurvivorInstruction(),
                deadline);
  }
  std::shared_ptr<rendezvous::KeyValueStore> JobStore(const std::string& job_id,
                                                      int generation) override {
    return MakeCoordinatorStore(stub_, job_id, generation);
  }

 private:
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (v1::CoordinatorService::Stub::*method)(
                                    grpc::ClientContext*, const Request&, Response*),
                                const Request& request, Response response,
                                absl::Duration deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(absl::ToInt64Milliseconds(deadline)));
    const grpc::Status s = (stub_.get()->*method)(&ctx, request, &response);
    if (!s.ok()) return rpc::ToAbslStatus(s);
    return response;
  }

  std::shared_ptr<v1::CoordinatorService::Stub> stub_;
};

}  // namespace

std::shared_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(
    std::shared_ptr<v1::CoordinatorService::Stub> stub) {
  return std::make_shared<GrpcCoordinatorClient>(std::move(stub));
}

}  // namespace pipetrain::worker
