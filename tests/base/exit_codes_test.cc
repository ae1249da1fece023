// The one exit-code table (runtime/base/exit_codes.h), code by code.
#include "runtime/base/exit_codes.h"

#include <gtest/gtest.h>

namespace pipetrain::exit_code {
namespace {

TEST(ExitCodes, TheTable) {
  EXPECT_EQ(kOk, 0);
  EXPECT_EQ(kJobFailed, 1);
  EXPECT_EQ(kUsage, 2);
  EXPECT_EQ(kNotFound, 3);
  EXPECT_EQ(kDenied, 4);
  EXPECT_EQ(kUnavailable, 5);
  EXPECT_EQ(kInterrupted, 130);
}

TEST(ExitCodes, EveryStatusCode) {
  using C = absl::StatusCode;
  const std::pair<C, int> expected[] = {
      {C::kOk, 0},
      {C::kCancelled, 1},
      {C::kUnknown, 1},
      {C::kInvalidArgument, 2},
      {C::kDeadlineExceeded, 5},
      {C::kNotFound, 3},
      {C::kAlreadyExists, 2},
      {C::kPermissionDenied, 4},
      {C::kResourceExhausted, 1},
      {C::kFailedPrecondition, 2},
      {C::kAborted, 1},
      {C::kOutOfRange, 2},
      {C::kUnimplemented, 1},
      {C::kInternal, 1},
      {C::kUnavailable, 5},
      {C::kDataLoss, 1},
      {C::kUnauthenticated, 4},
  };
  for (const auto& [code, exit] : expected) {
    EXPECT_EQ(For(code), exit) << absl::StatusCodeToString(code);
    EXPECT_EQ(For(absl::Status(code, "why")), exit) << absl::StatusCodeToString(code);
  }
  EXPECT_EQ(For(absl::OkStatus()), kOk);
  static_assert(For(absl::StatusCode::kNotFound) == kNotFound, "usable at compile time");
}

// How a job a program runs itself ended: its input's errors as above, anything else failed.
TEST(ExitCodes, AJobsEnd) {
  using C = absl::StatusCode;
  EXPECT_EQ(ForJob(absl::OkStatus()), kOk);
  EXPECT_EQ(ForJob(C::kInvalidArgument), kUsage);
  EXPECT_EQ(ForJob(C::kFailedPrecondition), kUsage);
  EXPECT_EQ(ForJob(C::kNotFound), kNotFound);
  for (C code : {C::kUnavailable, C::kDeadlineExceeded, C::kCancelled, C::kInternal,
                 C::kUnauthenticated, C::kAborted}) {
    EXPECT_EQ(ForJob(code), kJobFailed) << absl::StatusCodeToString(code);
  }
}

}  // namespace
}  // namespace pipetrain::exit_code
