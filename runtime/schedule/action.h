// One step of a stage's schedule, printable and parseable as short text.
//
// A schedule is data: each rank runs a list of Actions in order. Micro-batch numbers are
// global across steps: micro-batch j belongs to mini-batch (step) j / m. The text forms are
//   F3  B3  I3  W3  SEND_ACT3  RECV_ACT3  SEND_GRAD3  RECV_GRAD3  STEP0
// where STEP<t> is the optimizer step (weight update) that ends mini-batch t on that stage.
// For GPipe and 1F1B-with-flush it comes after the stage's last backward of the step (the
// flush); for PipeDream-2BW it is the weight-version switch right after the stage's last
// backward of mini-batch t, with no flush.
//
// Where a rank holds one stage (GPipe, 1F1B, 2BW) its list is that stage's and an action
// names no stage (kOwnStage). Where a rank holds several model chunks (interleaved,
// zero-bubble V, DualPipeV: runtime/schedule/chunked_schedule.h), each action names the
// chunk it runs on by its global stage number, written before the kind as PyTorch's
// pipelining prints it: "2F0" is the forward of micro-batch 0 through stage 2.
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
  kInputGradient,   // I<j>: the part of B<j> that makes the stage's input gradient
  kWeightGradient,  // W<j>: the rest of B<j>, the parameters' gradients (after its I<j>)
  kSendActivation,  // SEND_ACT<j>: send the output of F<j> to stage s+1
  kRecvActivation,  // RECV_ACT<j>: receive the input of F<j> from stage s-1
  kSendGradient,    // SEND_GRAD<j>: send the input gradient of B<j> to stage s-1
  kRecvGradient,    // RECV_GRAD<j>: receive the output gradient of B<j> from stage s+1
  kOptimizerStep,   // STEP<t>: apply the accumulated gradient of mini-batch t
};

// F, B, I or W: what computes (the rest moves tensors or updates weights).
inline bool IsCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kInputGradient || kind == ActionKind::kWeightGradient;
}
// B or I: what makes a stage's input gradient.
inline bool IsBackward(ActionKind kind) {
  return kind == ActionKind::kBackward || kind == ActionKind::kInputGradient;
}
// A send or a receive.
inline bool IsMessage(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kRecvActivation ||
         kind == ActionKind::kSendGradient || kind == ActionKind::kRecvGradient;
}

// The stage of an action in a list of one stage per rank: the list's own.
inline constexpr int kOwnStage = -1;

struct Action {
  ActionKind kind;
  int64_t index;          // micro-batch j, or mini-batch t for kOptimizerStep
  int stage = kOwnStage;  // the chunk it runs on (global stage number), or kOwnStage

  bool operator==(const Action& o) const {
    return kind == o.kind && index == o.index && stage == o.stage;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

inline Action F(int64_t j) { return {ActionKind::kForward, j}; }
inline Action B(int64_t j) { return {ActionKind::kBackward, j}; }
inline Action I(int64_t j) { return {ActionKind::kInputGradient, j}; }
inline Action W(int64_t j) { return {ActionKind::kWeightGradient, j}; }
inline Action SendAct(int64_t j) { return {ActionKind::kSendActivation, j}; }
inline Action RecvAct(int64_t j) { return {ActionKind::kRecvActivation, j}; }
inline Action SendGrad(int64_t j) { return {ActionKind::kSendGradient, j}; }
inline Action RecvGrad(int64_t j) { return {ActionKind::kRecvGradient, j}; }
inline Action Step(int64_t t) { return {ActionKind::kOptimizerStep, t}; }

// The same action on global stage `stage`.
inline Action OnStage(Action action, int stage) {
  action.stage = stage;
  return action;
}

// "F3", "SEND_ACT3", "STEP0", ...; with a stage, "2F3".
std::string ToString(const Action& action);
// The inverse of ToString. Rejects unknown names, missing or negative numbers, trailing text.
// Case-sensitive; also rejects leading zeros ("F03", "02F3") so that every text form is
// canonical.
absl::StatusOr<Action> ParseAction(std::string_view text);

// Space-separated list: "F0 SEND_ACT0 F1 ...".
std::string FormatActions(const std::vector<Action>& actions);
// Parses a whitespace-separated list; an empty string is an empty list.
absl::StatusOr<std::vector<Action>> ParseActions(std::string_view text);

}  // namespace pipetrain::schedule
