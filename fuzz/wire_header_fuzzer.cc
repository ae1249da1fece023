// libFuzzer target: the wire header decoder of the Gloo and NCCL transports
// (runtime/transport/wire_header.h) on any 128 bytes a peer could send. Properties: never a
// crash; an accepted header has at most 2^40 elements whose byte count matches, and encodes
// back to the very same words.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "runtime/transport/wire_header.h"

namespace {
// dtypes 0..15 with sizes 1, 2, 4, 8, 16 (cycling); anything else not carried.
int64_t ElementSize(int64_t dtype) {
  return dtype >= 0 && dtype < 16 ? int64_t{1} << (dtype % 5) : 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain::transport;
  int64_t words[kWireHeaderWords] = {};
  std::memcpy(words, data, size < sizeof(words) ? size : sizeof(words));
  absl::StatusOr<WireHeader> h = DecodeWireHeader(words, ElementSize);
  if (!h.ok()) return 0;
  int64_t elements = 1;
  for (int64_t d : h->shape) elements *= d;
  if (elements > kWireMaxElements || h->payload_bytes != elements * ElementSize(h->dtype)) {
    std::abort();
  }
  int64_t again[kWireHeaderWords];
  EncodeWireHeader(*h, again);
  if (std::memcmp(again, words, sizeof(words)) != 0) std::abort();
  return 0;
}
