// Internal to runtime/data (not part of the public contract): a fixed, portable random
// number generator, so that synthetic data and shuffles are bit-identical everywhere.
//
// SplitMix64 for seeding and hashing, xoshiro256** for streams, and our own conversions to
// uniform integers/doubles and normals (std::*_distribution differ between standard
// libraries).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pipetrain::data::internal {

// One SplitMix64 step: advances *state and returns the next output.
inline uint64_t SplitMix64Next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// A well-mixed 64-bit hash of x.
inline uint64_t Mix64(uint64_t x) { return SplitMix64Next(&x); }

// A well-mixed hash of the pair (a, b); not symmetric.
inline uint64_t HashPair(uint64_t a, uint64_t b) {
  return Mix64(Mix64(a) ^ (b + 0x632BE59BD9B4E019ULL));
}

// xoshiro256** 1.0 (Blackman & Vigna), seeded through SplitMix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& word : s_) word = SplitMix64Next(&sm);
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1), 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n >= 1, without modulo bias (rejection sampling).
  uint64_t UniformInt(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    for (;;) {
      const uint64_t x = Next();
      if (x >= threshold) return x % n;
    }
  }

  // Standard normal by the Box-Muller transform; the second value of each pair is kept for
  // the next call.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]: log is finite
    const double u2 = Uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * kPi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  static constexpr double kPi = 3.14159265358979323846;
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// For contract violations of functions that cannot return a status (e.g. Read() with an id
// out of range): prints the message and aborts.
[[noreturn]] inline void Fatal(const std::string& what) {
  std::fprintf(stderr, "pipetrain::data fatal: %s\n", what.c_str());
  std::abort();
}

}  // namespace pipetrain::data::internal
