// pipetrain.v1.StepCommand <-> the runtime's step command bits (runtime/control), for the
// coordinator, which relays commands, and the workers, which queue them and report them done.
#pragma once

#include <cstdint>
#include <vector>

#include "pipetrain/v1/job.pb.h"

namespace pipetrain::jobspec {

// The control::StepCommand bit of `command`; 0 for UNSPECIFIED or an unknown value.
uint32_t StepCommandBit(v1::StepCommand command);
// Every command in a set of control::StepCommand bits, in the order of the enum.
std::vector<v1::StepCommand> StepCommandsOf(uint32_t bits);

}  // namespace pipetrain::jobspec
