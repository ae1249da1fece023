// The gRPC health check of a whole server (grpc.health.v1.Health/Check with no service
// name), made without the generated health stub, which gRPC's packages do not install.
#pragma once

#include <memory>

#include <grpcpp/grpcpp.h>

namespace pipetrain::rpc {

// Whether the server behind `channel` says SERVING; the call's own failure otherwise.
// `context` carries the deadline (and any metadata).
grpc::Status CheckServing(const std::shared_ptr<grpc::Channel>& channel,
                          grpc::ClientContext* context, bool* serving);

}  // namespace pipetrain::rpc
