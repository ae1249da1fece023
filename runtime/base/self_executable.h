// The path of the running program (/proc/self/exe), so that it can start copies of itself
// (stage processes, the profiler's link peer). "" when it cannot be read.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace pipetrain {

inline std::string SelfExecutable() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.string();
}

}  // namespace pipetrain
