#include "coordinator/worker_client.h"

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/status.h"

namespace pipetrain::coordinator {
namespace {

using rpc::ToAbslStatus;

class GrpcWorkerClient : public WorkerClient {
 public:
  explicit GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::WorkerService::NewStub(channel)) {}

  absl::Status AssignStage(const v1::StageAssignment& assignment) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::AssignResponse response;
    return ToAbslStatus(stub_->AssignStage(&ctx, assignment, &response));
  }
  absl::Status StopStage(const v1::StopStageRequest& request) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::AssignResponse response;
    return ToAbslStatus(stub_->StopStage(&ctx, request, &response));
  }
  absl::StatusOr<v1::SendCommandResponse> ScheduleCommand(
      const v1::SendCommandRequest& request) override {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SendCommandResponse response;
    grpc::Status s = stub_->ScheduleCommand(&ctx, request, &response);
    if (!s.ok()) return ToAbslStatus(s);
    return response;
  }

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

WorkerConnector GrpcWorkerConnector(const rpc::SecurityOptions& security) {
  return [security](const std::string& address)
             -> absl::StatusOr<std::shared_ptr<WorkerClient>> {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::MakeChannel(address, security);
    if (!channel.ok()) return channel.status();
    return std::shared_ptr<WorkerClient>(std::make_shared<GrpcWorkerClient>(*channel));
  };
}

}  // namespace pipetrain::coordinator
