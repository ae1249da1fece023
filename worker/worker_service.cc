#include "worker/worker_service.h"

#include <algorithm>

#include "rpc/security.h"
#include "rpc/status.h"
#include "worker/worker.h"

namespace pipetrain::worker {

grpc::Status WorkerServiceAdapter::RefuseWithoutCommandKey(
    const grpc::ServerContext& context) const {
  if (rpc::CarriesCommandKey(context, command_key_)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "only the coordinator this worker registered with may command it "
                      "(missing or wrong command key)");
}

grpc::Status WorkerServiceAdapter::Ping(grpc::ServerContext* context, const v1::PingRequest*,
                                        v1::PingResponse*) {
  return RefuseWithoutCommandKey(*context);
}

grpc::Status WorkerServiceAdapter::AssignStage(grpc::ServerContext* context,
                                               const v1::StageAssignment* request,
                                               v1::AssignResponse*) {
  if (grpc::Status s = RefuseWithoutCommandKey(*context); !s.ok()) return s;
  return rpc::ToGrpcStatus(worker_->Assign(*request));
}

grpc::Status WorkerServiceAdapter::StopStage(grpc::ServerContext* context,
                                             const v1::StopStageRequest* request,
                                             v1::AssignResponse*) {
  if (grpc::Status s = RefuseWithoutCommandKey(*context); !s.ok()) return s;
  worker_->StopRank(*request);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceAdapter::ScheduleCommand(grpc::ServerContext* context,
                                                   const v1::SendCommandRequest* request,
                                                   v1::SendCommandResponse* response) {
  if (grpc::Status s = RefuseWithoutCommandKey(*context); !s.ok()) return s;
  absl::StatusOr<int64_t> step = worker_->ScheduleCommand(*request);
  if (!step.ok()) return rpc::ToGrpcStatus(step.status());
  response->set_step(*step);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceAdapter::FetchLayerState(
    grpc::ServerContext*, const v1::FetchLayerStateRequest* request,
    grpc::ServerWriter<v1::LayerStateChunk>* writer) {
  absl::StatusOr<std::shared_ptr<const std::string>> bytes =
      held_->Layer(request->job_id(), request->step(), request->layer(), request->state_key());
  if (!bytes.ok()) return rpc::ToGrpcStatus(bytes.status());
  const std::string& all = **bytes;
  size_t offset = 0;
  do {
    v1::LayerStateChunk chunk;
    chunk.set_total_bytes(static_cast<int64_t>(all.size()));
    const size_t n = std::min(kLayerChunkBytes, all.size() - offset);
    chunk.set_data(all.substr(offset, n));
    offset += n;
    if (!writer->Write(chunk)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
    }
  } while (offset < all.size());
  return grpc::Status::OK;
}

}  // namespace pipetrain::worker
