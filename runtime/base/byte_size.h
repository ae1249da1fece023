// A byte count in words, for messages and tables: "512 B", "1.5 KiB", "16.0 GiB" (powers of
// 1024, one decimal). Header-only, no dependency beyond Abseil.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain {

inline std::string ByteSize(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  for (; value >= 1024 && unit < 5; ++unit) value /= 1024;
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

}  // namespace pipetrain
