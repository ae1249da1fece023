// Resident memory of this process, as the kernel counts it (Linux /proc/self/status).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace pipetrain {

namespace internal {
// The value of a "<field>:   <n> kB" line of /proc/self/status in bytes; 0 if unreadable.
inline int64_t ProcStatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") == 0) {
      return std::stoll(line.substr(field.size() + 1)) * 1024;
    }
  }
  return 0;
}
}  // namespace internal

// The process's resident set now (VmRSS) and its high-water mark since it started (VmHWM).
inline int64_t ResidentMemoryBytes() { return internal::ProcStatusBytes("VmRSS"); }
inline int64_t PeakResidentMemoryBytes() { return internal::ProcStatusBytes("VmHWM"); }

}  // namespace pipetrain
