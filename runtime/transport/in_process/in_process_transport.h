// Stages (and replicas) as threads of one process: messages are tensors handed over through
// a shared mailbox, without copies; AllReduceMean sums in the order of replica index, so the
// result does not depend on thread timing; a collective's members hand in clones of their
// tensors. For tests and for several stages on one device. Thread-safe (a stage's
// collectives on one group are called from one thread at a time).
#pragma once

#include <memory>

#include "runtime/transport/transport.h"

namespace pipetrain::transport {

// The shared mailbox of one pipeline; create one per job and one Transport per stage.
class InProcessHub;

std::shared_ptr<InProcessHub> MakeInProcessHub();
// Stage `stage` of `stages`, of replica `replica` out of `replicas` pipelines sharing `hub`.
std::unique_ptr<Transport> MakeInProcessTransport(std::shared_ptr<InProcessHub> hub, int stage,
                                                  int stages, int replica = 0, int replicas = 1);

}  // namespace pipetrain::transport
