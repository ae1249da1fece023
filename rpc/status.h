// absl::Status <-> grpc::Status: the only conversion between the two in the control plane.
//
// The codes map one to one (both follow google.rpc.Code: OK 0 ... UNAUTHENTICATED 16, the
// same number on each side); the message is kept as it is. A gRPC code outside that range
// becomes UNKNOWN. Neither direction adds or drops anything else (absl payloads and gRPC
// error details are not carried).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pipetrain::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status ToAbslStatus(const grpc::Status& status);

}  // namespace pipetrain::rpc
