// Time, in the two forms the project measures it:
//   - MonotonicSeconds(): a steady clock in seconds as double, so that per-action timings and
//     the simulator speak the same unit;
//   - Clock: wall time (absl::Time) as a component sees it, injected so that rules driven by
//     time (heartbeat loss, queueing, restarts, recovery grace) are tested with a FakeClock
//     the test moves, without sleeps. The one definition for every daemon and its tests.
#pragma once

#include <chrono>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pipetrain {

// Seconds since an arbitrary fixed origin (steady clock). Thread-safe.
inline double MonotonicSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Implementations are thread-safe.
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

// A clock that moves only when told (tests and fuzzers). Starts at a fixed time.
class FakeClock : public Clock {
 public:
  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

}  // namespace pipetrain
