// The profiler's two statistics of a measurement: the seconds between two steady_clock
// readings and the median of samples (the upper middle one of an even count; 0 for none).
// Pure functions, safe from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace pipetrain::profiler {

inline double Seconds(std::chrono::steady_clock::time_point a,
                      std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace pipetrain::profiler
