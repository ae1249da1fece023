// The exit codes of every pipetrain command-line program (`pipetrain`, `pipetrain-run`, and
// the daemons where they apply), and the one mapping from an absl::StatusCode to them.
//
//   0   ok
//   1   the job failed (and any error not listed below)
//   2   bad usage or an invalid job: InvalidArgument, FailedPrecondition, AlreadyExists,
//       OutOfRange
//   3   not found: NotFound (a job id, a job file, a data file)
//   4   unauthenticated or permission denied: Unauthenticated, PermissionDenied
//   5   unavailable or deadline exceeded: Unavailable, DeadlineExceeded
//   130 interrupted (SIGINT)
//
// For() maps a status from what a program asks of others (a call to a daemon, a file to
// read); ForJob() maps how a job that the program runs itself ended.
//
// Header-only and Abseil only (no gRPC, no LibTorch), so that pipetrain-run, which builds
// without gRPC, and the CLI, which links no runtime, share it. A gRPC status goes through
// rpc::ToAbslStatus (rpc/status.h) first.
#pragma once

#include "absl/status/status.h"

namespace pipetrain::exit_code {

inline constexpr int kOk = 0;
inline constexpr int kJobFailed = 1;
inline constexpr int kUsage = 2;
inline constexpr int kNotFound = 3;
inline constexpr int kDenied = 4;
inline constexpr int kUnavailable = 5;
inline constexpr int kInterrupted = 130;

// The exit code of a program that ends with an error of `code` (kOk for absl::StatusCode::kOk).
constexpr int For(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return kOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange: return kUsage;
    case absl::StatusCode::kNotFound: return kNotFound;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied: return kDenied;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded: return kUnavailable;
    default: return kJobFailed;
  }
}

inline int For(const absl::Status& status) { return For(status.code()); }

// The exit code of a program whose job ended with `status` (pipetrain-run): what the job was
// given is judged as For() says (2 bad usage or invalid job, 3 a file it names not found);
// anything else is the job failing (1), a lost stage (Unavailable) or a wait past its
// timeout (DeadlineExceeded) included: 4 and 5 are for a service the program calls.
constexpr int ForJob(absl::StatusCode code) {
  const int exit = For(code);
  return exit == kOk || exit == kUsage || exit == kNotFound ? exit : kJobFailed;
}

inline int ForJob(const absl::Status& status) { return ForJob(status.code()); }

}  // namespace pipetrain::exit_code
