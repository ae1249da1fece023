#include "jobspec/step_commands.h"

#include <utility>

#include "runtime/control/step_commands.h"

namespace pipetrain::jobspec {
namespace {
constexpr std::pair<v1::StepCommand, uint32_t> kStepCommands[] = {
    {v1::STEP_COMMAND_FLUSH, control::kFlush},
    {v1::STEP_COMMAND_SWITCH_VERSION, control::kSwitchVersion},
    {v1::STEP_COMMAND_CHECKPOINT, control::kCheckpoint},
    {v1::STEP_COMMAND_STOP, control::kStop},
};
}  // namespace

uint32_t StepCommandBit(v1::StepCommand command) {
  for (const auto& [c, bit] : kStepCommands) {
    if (c == command) return bit;
  }
  return 0;
}

std::vector<v1::StepCommand> StepCommandsOf(uint32_t bits) {
  std::vector<v1::StepCommand> commands;
  for (const auto& [c, bit] : kStepCommands) {
    if (bits & bit) commands.push_back(c);
  }
  return commands;
}

}  // namespace pipetrain::jobspec
