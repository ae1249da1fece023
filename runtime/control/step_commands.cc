#include "runtime/control/step_commands.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::control {
namespace {

struct Named {
  StepCommand command;
  const char* name;
};
constexpr Named kNames[] = {
    {kFlush, "flush"}, {kSwitchVersion, "switch"}, {kCheckpoint, "checkpoint"}, {kStop, "stop"}};

}  // namespace

std::string StepCommandsName(uint32_t commands) {
  std::vector<std::string> names;
  for (const Named& n : kNames) {
    if (commands & n.command) names.push_back(n.name);
  }
  return absl::StrJoin(names, "+");
}

absl::StatusOr<StepCommand> ParseStepCommand(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "switch-version") return kSwitchVersion;
  for (const Named& n : kNames) {
    if (lower == n.name) return n.command;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown step command '", std::string(name),
                                                 "'; accepted: flush, switch, checkpoint, stop"));
}

StepCommandQueue::StepCommandQueue(int64_t steps, int64_t first_step)
    : steps_(steps), sealed_through_(first_step + 1) {}

void StepCommandQueue::StartAt(int64_t first_step) {
  absl::MutexLock lock(&mu_);
  sealed_through_ = std::max(sealed_through_, first_step + 1);
}

absl::StatusOr<int64_t> StepCommandQueue::Schedule(uint32_t command, int64_t step) {
  if (command == 0 || (command & ~kAllStepCommands) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown step command bits ", command));
  }
  absl::MutexLock lock(&mu_);
  if (step == 0) step = sealed_through_ + 1;
  if (step < 1 || step >= steps_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step,
                     " is not a boundary of this job: a command takes effect "
                     "before step N for 1 <= N < ",
                     steps_, " (the job has ", steps_, " steps)"));
  }
  if (step <= sealed_through_) {
    if (sealed_through_ + 1 >= steps_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "too late for step ", step, ": stage 0 is past the last boundary it can still change"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("too late for step ", step, ": stage 0 has fixed the boundaries up to ",
                     sealed_through_, "; the earliest still open is ", sealed_through_ + 1));
  }
  for (const auto& [at, commands] : pending_) {
    if ((commands & kStop) && at < step) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job stops at step ", at, ", before step ", step));
    }
  }
  pending_[step] |= command;
  return step;
}

uint32_t StepCommandQueue::Seal(int64_t step) {
  absl::MutexLock lock(&mu_);
  sealed_through_ = std::max(sealed_through_, step);
  auto it = pending_.find(step);
  if (it == pending_.end()) return 0;
  const uint32_t commands = it->second;
  pending_.erase(it);
  return commands;
}

int64_t StepCommandQueue::earliest_open() const {
  absl::MutexLock lock(&mu_);
  return std::min(sealed_through_ + 1, steps_);
}

}  // namespace pipetrain::control
