// A gRPC server interceptor that times every call: the histogram
// pipetrain_rpc_duration_seconds{method, code}, from the call's start to its status being
// sent (method "/pipetrain.v1.JobService/GetJob", code "OK", "INVALID_ARGUMENT", ...). A
// streaming call counts once, when it ends.
#pragma once

#include <memory>

#include <grpcpp/support/server_interceptor.h>

#include "metrics/metrics.h"

namespace pipetrain::rpc {

// `registry` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory(metrics::Registry* registry);

// "OK", "CANCELLED", ... "UNAUTHENTICATED".
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace pipetrain::rpc
