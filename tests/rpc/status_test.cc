// absl::Status <-> grpc::Status (rpc/status.h): every code both ways, the message kept.
#include "rpc/status.h"

#include <gtest/gtest.h>

namespace pipetrain::rpc {
namespace {

TEST(RpcStatus, EveryCodeBothWaysWithItsMessage) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "what went wrong");
    const grpc::Status converted = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(converted.error_code()), code);
    EXPECT_EQ(converted.error_message(), "what went wrong");
    EXPECT_EQ(ToAbslStatus(converted), status);
  }
}

TEST(RpcStatus, OkAndUnknownCodes) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(ToAbslStatus(grpc::Status::OK).ok());
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("missing or wrong token")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const absl::Status odd = ToAbslStatus(grpc::Status(static_cast<grpc::StatusCode>(99), "odd"));
  EXPECT_EQ(odd.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(odd.message(), "odd");
}

}  // namespace
}  // namespace pipetrain::rpc
