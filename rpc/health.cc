#include "rpc/health.h"

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>

namespace pipetrain::rpc {

grpc::Status CheckServing(const std::shared_ptr<grpc::Channel>& channel,
                          grpc::ClientContext* context, bool* serving, const std::string& service) {
  grpc::GenericStub generic(channel);
  // HealthCheckRequest{service}: field 1, length-delimited (a varint length, then the bytes).
  std::string encoded;
  if (!service.empty()) {
    encoded.push_back('\x0a');
    for (size_t n = service.size();; n >>= 7) {
      if (n < 0x80) {
        encoded.push_back(static_cast<char>(n));
        break;
      }
      encoded.push_back(static_cast<char>((n & 0x7f) | 0x80));
    }
    encoded += service;
  }
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      std::lock_guard<std::mutex> lock(mu);
                      status = s;
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "unreadable health check response");
  }
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status: SERVING}: field 1, varint 1.
  *serving = bytes == std::string("\x08\x01", 2);
  return grpc::Status::OK;
}

}  // namespace pipetrain::rpc
