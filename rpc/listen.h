// How every gRPC server of the control plane (the coordinator's, each worker's) takes its
// address: exclusively. gRPC binds with SO_REUSEPORT unless told otherwise, so a second daemon
// started on the address a live one serves would bind too, take a share of its new
// connections, and own the address once the first goes; with the port bound exclusively the
// second is refused at start and the first serves on.
//
// Stateless; thread-safe.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace pipetrain::rpc {

// Adds `address` (host:port, port 0: any free one) to `builder` with `credentials`, bound
// exclusively (no SO_REUSEPORT); `*port` gets the port once the server starts (0 if it
// could not bind). The option applies to the builder's server as a whole.
void ListenExclusively(grpc::ServerBuilder& builder, const std::string& address,
                       const std::shared_ptr<grpc::ServerCredentials>& credentials, int* port);

// The error of a server that could not take `address` (the value of flag `flag`, e.g.
// "--listen"): Unavailable, naming both and why, as far as binding a socket there again
// tells: "the port is in use (another process listens there)", "... is not an address of
// this host", and so on.
absl::Status CannotListen(const std::string& flag, const std::string& address);

}  // namespace pipetrain::rpc
