// Time as the coordinator sees it. Injected, so that heartbeat loss, queueing and restarts are
// unit-tested with a clock the test moves (tests/coordinator), without sleeps.
#pragma once

#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pipetrain::coordinator {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock.
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace pipetrain::coordinator
