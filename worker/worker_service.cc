#include "worker/worker_service.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include <grpcpp/alarm.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

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

namespace {

// A call answered with `status` and nothing else.
class Refusal final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit Refusal(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

// A refused fetch answered after `delay` (an alarm, no thread held), so that a client looping
// over refused calls makes a few a second rather than thousands; `on_done` runs once the call
// is over.
class DelayedRefusal final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DelayedRefusal(grpc::Status status, absl::Duration delay, std::function<void()> on_done)
      : status_(std::move(status)), on_done_(std::move(on_done)) {
    alarm_.Set(absl::ToChronoTime(absl::Now() + delay), [this](bool) { Finish(status_); });
  }
  void OnDone() override {
    on_done_();
    delete this;
  }

 private:
  const grpc::Status status_;
  const std::function<void()> on_done_;
  grpc::Alarm alarm_;
};

// Appends `value` as a protobuf varint.
void AppendVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// Writes a held layer as LayerStateChunk messages, one at a time: each the message's header
// (field 2, total_bytes; field 1's tag and length) and a slice of the layer's bytes that
// refers to them, sharing their ownership until gRPC frees the slice. `on_done` runs once the
// call is over, whatever its end.
class LayerWriter final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  LayerWriter(std::shared_ptr<const std::string> bytes, std::function<void()> on_done)
      : bytes_(std::move(bytes)), on_done_(std::move(on_done)) {
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
      return;
    }
    if (offset_ >= bytes_->size()) {
      Finish(grpc::Status::OK);
      return;
    }
    WriteNext();
  }
  void OnDone() override {
    on_done_();
    delete this;
  }

 private:
  void WriteNext() {
    const size_t n = std::min(WorkerServiceAdapter::kLayerChunkBytes, bytes_->size() - offset_);
    std::string header;
    header.push_back(0x10);  // field 2, varint: total_bytes
    AppendVarint(header, bytes_->size());
    header.push_back(0x0a);  // field 1, length-delimited: data
    AppendVarint(header, n);
    // The slice owns a reference to the layer's bytes, dropped when gRPC is done with it.
    auto* owner = new std::shared_ptr<const std::string>(bytes_);
    grpc::Slice slices[2] = {
        grpc::Slice(header),
        grpc::Slice(
            const_cast<char*>(bytes_->data()) + offset_, n,
            [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); }, owner)};
    offset_ += n;
    buffer_ = grpc::ByteBuffer(slices, 2);
    StartWrite(&buffer_);
  }

  const std::shared_ptr<const std::string> bytes_;
  const std::function<void()> on_done_;
  size_t offset_ = 0;
  grpc::ByteBuffer buffer_;  // the chunk being written
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerServiceAdapter::FetchLayerState(
    grpc::CallbackServerContext*, const grpc::ByteBuffer* raw) {
  v1::FetchLayerStateRequest request;
  std::vector<grpc::Slice> slices;
  if (!raw->Dump(&slices).ok()) {
    return new Refusal(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
  }
  std::string wire;
  for (const grpc::Slice& slice : slices) {
    wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (!request.ParseFromString(wire)) {
    return new Refusal(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "the request is not a FetchLayerStateRequest"));
  }
  // The key before anything else (held_state.h): a call without it learns nothing and costs
  // only this.
  absl::StatusOr<std::shared_ptr<const std::string>> bytes =
      held_->Layer(request.job_id(), request.step(), request.layer(), request.state_key());
  if (absl::IsPermissionDenied(bytes.status()) &&
      delayed_refusals_.fetch_add(1) < kMaxDelayedRefusals) {
    return new DelayedRefusal(rpc::ToGrpcStatus(bytes.status()), kRefusalDelay,
                              [this] { delayed_refusals_.fetch_sub(1); });
  }
  if (absl::IsPermissionDenied(bytes.status())) delayed_refusals_.fetch_sub(1);
  if (!bytes.ok()) return new Refusal(rpc::ToGrpcStatus(bytes.status()));
  if (fetches_.fetch_add(1) >= kMaxFetches) {
    fetches_.fetch_sub(1);
    return new Refusal(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this worker serves at most ", kMaxFetches,
                     " fetches of its held state at once: ask another holder, or again")));
  }
  return new LayerWriter(*std::move(bytes), [this] { fetches_.fetch_sub(1); });
}

}  // namespace pipetrain::worker
