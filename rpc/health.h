// The gRPC health check (grpc.health.v1.Health/Check) of a whole server or of one of its
// services, as a Kubernetes gRPC probe makes it; without the generated health stub, which
// gRPC's packages do not install.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace pipetrain::rpc {

// Whether the server behind `channel` says SERVING for `service` ("": the server as a
// whole); the call's own failure otherwise (NOT_FOUND: no such service). `context` carries
// the deadline (and any metadata).
grpc::Status CheckServing(const std::shared_ptr<grpc::Channel>& channel,
                          grpc::ClientContext* context, bool* serving,
                          const std::string& service = "");

}  // namespace pipetrain::rpc
