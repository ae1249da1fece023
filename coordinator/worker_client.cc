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
  GrpcWorkerClient(std::shared_ptr<grpc::Channel> channel, std::string command_key)
      : stub_(v1::WorkerService::NewStub(channel)), command_key_(std::move(command_key)) {}

  // A worker is assigned a rank right after it registered or reported itself alive, so a
  // failed first connection is more likely a transient loopback or scheduling hiccup than a
  // dead worker: one more try waits for the channel to connect (at most 3 s) before the
  // failure counts.
  absl::Status AssignStage(const v1::StageAssignment& assignment) override {
    grpc::Status s;
    for (int attempt = 0; attempt < 2; ++attempt) {
      grpc::ClientContext ctx;
      rpc::AddCommandKey(ctx, command_key_);
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(attempt == 0 ? 10 : 3));
      ctx.set_wait_for_ready(attempt > 0);
      v1::AssignResponse response;
      s = stub_->AssignStage(&ctx, assignment, &response);
      if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    }
    return ToAbslStatus(s);
  }
  absl::Status StopStage(const v1::StopStageRequest& request) override {
    grpc::ClientContext ctx;
    rpc::AddCommandKey(ctx, command_key_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::AssignResponse response;
    return ToAbslStatus(stub_->StopStage(&ctx, request, &response));
  }
  absl::StatusOr<v1::SendCommandResponse> ScheduleCommand(
      const v1::SendCommandRequest& request) override {
    grpc::ClientContext ctx;
    rpc::AddCommandKey(ctx, command_key_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SendCommandResponse response;
    grpc::Status s = stub_->ScheduleCommand(&ctx, request, &response);
    if (!s.ok()) return ToAbslStatus(s);
    return response;
  }
  absl::Status Ping() override {
    grpc::ClientContext ctx;
    rpc::AddCommandKey(ctx, command_key_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::PingResponse response;
    return ToAbslStatus(stub_->Ping(&ctx, v1::PingRequest(), &response));
  }

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  const std::string command_key_;
};

}  // namespace

WorkerConnector GrpcWorkerConnector(const rpc::SecurityOptions& security) {
  return [security](
             const std::string& address,
             const std::string& command_key) -> absl::StatusOr<std::shared_ptr<WorkerClient>> {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = rpc::MakeChannel(address, security);
    if (!channel.ok()) return channel.status();
    // Connects now, in the background, not at the first assignment: a job of thousands of
    // ranks would otherwise open thousands of connections at once when it is placed (and
    // slow the heartbeats the coordinator answers meanwhile); registrations come spread out.
    (void)(*channel)->GetState(/*try_to_connect=*/true);
    return std::shared_ptr<WorkerClient>(std::make_shared<GrpcWorkerClient>(*channel, command_key));
  };
}

}  // namespace pipetrain::coordinator
