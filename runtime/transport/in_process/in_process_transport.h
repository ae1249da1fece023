// Stages of one pipeline as threads of one process: messages are tensors handed over
// through a shared mailbox, without copies. For tests and for several stages on one device.
// Thread-safe.
#pragma once

#include <memory>

#include "runtime/transport/transport.h"

namespace pipetrain::transport {

// The shared mailbox of one pipeline; create one per job and one Transport per stage.
class InProcessHub;

std::shared_ptr<InProcessHub> MakeInProcessHub();
std::unique_ptr<Transport> MakeInProcessTransport(std::shared_ptr<InProcessHub> hub, int stage);

}  // namespace pipetrain::transport
