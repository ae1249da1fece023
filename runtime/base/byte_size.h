// Byte counts in words, for messages and tables: the one definition of how the CLI, the
// runner and the daemons write them. Header-only, no dependency beyond Abseil.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain {

// "512 B", "1.5 KiB", "16.0 GiB" (powers of 1024, one decimal).
inline std::string ByteSize(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  for (; value >= 1024 && unit < 5; ++unit) value /= 1024;
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

// As ByteSize, or "-" for a count not reported yet (0 or less).
inline std::string ByteSizeOrDash(int64_t bytes) { return bytes <= 0 ? "-" : ByteSize(bytes); }

// "12.3 MiB" always in MiB, for a table's column; "-" for a count not reported yet.
inline std::string MebiBytes(int64_t bytes) {
  return bytes <= 0 ? "-" : absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace pipetrain
