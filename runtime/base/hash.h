// Portable 64-bit mixing for seeds: the same value on every machine and standard library.
#pragma once

#include <cstdint>

namespace pipetrain {

// The SplitMix64 output function of x (Steele, Lea and Flood): a well-mixed 64-bit hash.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace pipetrain
