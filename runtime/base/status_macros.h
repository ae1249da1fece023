// Status propagation macros for absl::Status / absl::StatusOr.
//
// Debian's Abseil (20220623) has no RETURN_IF_ERROR / ASSIGN_OR_RETURN; these are the
// project's only definitions. Errors are values across every boundary of the runtime:
// exceptions from LibTorch are caught at the adapter and turned into a status with context.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PT_CONCAT_INNER_(a, b) a##b
#define PT_CONCAT_(a, b) PT_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define PT_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status pt_status_ = (expr);      \
    if (!pt_status_.ok()) return pt_status_; \
  } while (false)

// `PT_ASSIGN_OR_RETURN(auto x, F());` declares/assigns x from an absl::StatusOr, or returns
// its error from the enclosing function.
#define PT_ASSIGN_OR_RETURN(lhs, expr) \
  PT_ASSIGN_OR_RETURN_IMPL_(PT_CONCAT_(pt_statusor_, __LINE__), lhs, expr)
#define PT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return std::move(tmp).status();  \
  lhs = std::move(tmp).value()
