// One step of a stage's schedule, printable and parseable as short text.
//
// A schedule is data: each stage runs a list of Actions in order. Micro-batch numbers are
// global across steps: micro-batch j belongs to mini-batch (step) j / m. The text forms are
//   F3  B3  SEND_ACT3  RECV_ACT3  SEND_GRAD3  RECV_GRAD3  STEP0
// where STEP<t> is the optimizer step (weight update) that ends mini-batch t on that stage.
// For GPipe and 1F1B-with-flush it comes after the stage's last backward of the step (the
// flush); for PipeDream-2BW it is the weight-version switch right after the stage's last
// backward of mini-batch t, with no flush.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::schedule {

enum class ActionKind {
  kForward,         // F<j>: forward of micro-batch j through this stage
  kBackward,        // B<j>: backward of micro-batch j through this stage
  kSendActivation,  // SEND_ACT<j>: send the output of F<j> to stage s+1
  kRecvActivation,  // RECV_ACT<j>: receive the input of F<j> from stage s-1
  kSendGradient,    // SEND_GRAD<j>: send the input gradient of B<j> to stage s-1
  kRecvGradient,    // RECV_GRAD<j>: receive the output gradient of B<j> from stage s+1
  kOptimizerStep,   // STEP<t>: apply the accumulated gradient of mini-batch t
};

struct Action {
  ActionKind kind;
  int64_t index;  // micro-batch j, or mini-batch t for kOptimizerStep

  bool operator==(const Action& o) const { return kind == o.kind && index == o.index; }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

inline Action F(int64_t j) { return {ActionKind::kForward, j}; }
inline Action B(int64_t j) { return {ActionKind::kBackward, j}; }
inline Action SendAct(int64_t j) { return {ActionKind::kSendActivation, j}; }
inline Action RecvAct(int64_t j) { return {ActionKind::kRecvActivation, j}; }
inline Action SendGrad(int64_t j) { return {ActionKind::kSendGradient, j}; }
inline Action RecvGrad(int64_t j) { return {ActionKind::kRecvGradient, j}; }
inline Action Step(int64_t t) { return {ActionKind::kOptimizerStep, t}; }

// "F3", "SEND_ACT3", "STEP0", ...
std::string ToString(const Action& action);
// The inverse of ToString. Rejects unknown names, missing or negative numbers, trailing text.
// Case-sensitive; also rejects leading zeros ("F03") so that every text form is canonical.
absl::StatusOr<Action> ParseAction(std::string_view text);

// Space-separated list: "F0 SEND_ACT0 F1 ...".
std::string FormatActions(const std::vector<Action>& actions);
// Parses a whitespace-separated list; an empty string is an empty list.
absl::StatusOr<std::vector<Action>> ParseActions(std::string_view text);

}  // namespace pipetrain::schedule
