#include "rpc/status.h"

#include <string>

namespace pipetrain::rpc {
namespace {

// One to one: every canonical code has the same number on both sides.
#define PT_SAME_CODE_(absl_code, grpc_code)                        \
  static_assert(static_cast<int>(absl::StatusCode::absl_code) ==   \
                    static_cast<int>(grpc::StatusCode::grpc_code), \
                #absl_code " and " #grpc_code " must have the same number")
PT_SAME_CODE_(kOk, OK);
PT_SAME_CODE_(kCancelled, CANCELLED);
PT_SAME_CODE_(kUnknown, UNKNOWN);
PT_SAME_CODE_(kInvalidArgument, INVALID_ARGUMENT);
PT_SAME_CODE_(kDeadlineExceeded, DEADLINE_EXCEEDED);
PT_SAME_CODE_(kNotFound, NOT_FOUND);
PT_SAME_CODE_(kAlreadyExists, ALREADY_EXISTS);
PT_SAME_CODE_(kPermissionDenied, PERMISSION_DENIED);
PT_SAME_CODE_(kResourceExhausted, RESOURCE_EXHAUSTED);
PT_SAME_CODE_(kFailedPrecondition, FAILED_PRECONDITION);
PT_SAME_CODE_(kAborted, ABORTED);
PT_SAME_CODE_(kOutOfRange, OUT_OF_RANGE);
PT_SAME_CODE_(kUnimplemented, UNIMPLEMENTED);
PT_SAME_CODE_(kInternal, INTERNAL);
PT_SAME_CODE_(kUnavailable, UNAVAILABLE);
PT_SAME_CODE_(kDataLoss, DATA_LOSS);
PT_SAME_CODE_(kUnauthenticated, UNAUTHENTICATED);
#undef PT_SAME_CODE_

constexpr int kLastCode = static_cast<int>(grpc::StatusCode::UNAUTHENTICATED);

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::Status::code() is always canonical (a non-canonical raw code reads as kUnknown).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status ToAbslStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  return absl::Status(code > 0 && code <= kLastCode ? static_cast<absl::StatusCode>(code)
                                                    : absl::StatusCode::kUnknown,
                      status.error_message());
}

}  // namespace pipetrain::rpc
