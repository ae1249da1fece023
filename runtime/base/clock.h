// Time for measurements: a monotonic clock in seconds as double, so that per-action timings
// and the simulator speak the same unit.
#pragma once

#include <chrono>

namespace pipetrain {

// Seconds since an arbitrary fixed origin (steady clock). Thread-safe.
inline double MonotonicSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace pipetrain
