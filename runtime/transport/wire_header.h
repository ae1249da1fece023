// The header every point-to-point message of the Gloo and NCCL transports starts with, and
// its checked decoding. Plain data: no LibTorch, so the decoder is fuzzed on its own
// (fuzz/wire_header_fuzzer.cc).
//
// Layout: kWireHeaderWords little-endian int64 words
//   [0] message kind (MessageKind: 0 activation, 1 gradient, 2 control, 3 weight version,
//       4 evaluated activation, 5 evaluation's progress)
//   [1] the message's number (transport.h), >= 0
//   [2] dtype (at::ScalarType's number)
//   [3] ndim, 0 .. kWireMaxDims
//   [4] 1 if the payload follows inline in the same message (Gloo, small payloads), else 0
//   [5 .. 5+ndim) the dims, each >= 0; every word after them 0.
// A decoded header's element count is at most kWireMaxElements, so its payload size never
// overflows and a receiver never allocates what a peer's garbage says.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::transport {

inline constexpr int kWireHeaderWords = 16;
inline constexpr int kWireMaxDims = 8;
inline constexpr int64_t kWireMaxElements = int64_t{1} << 40;
inline constexpr int64_t kWireMessageKinds = 6;

struct WireHeader {
  int64_t kind = 0;
  int64_t micro_batch = 0;
  int64_t dtype = 0;
  bool inline_payload = false;
  std::vector<int64_t> shape;
  int64_t payload_bytes = 0;  // set by DecodeWireHeader: elements x element size
};

// Writes kWireHeaderWords words. REQUIRES: shape.size() <= kWireMaxDims.
void EncodeWireHeader(const WireHeader& header, int64_t* words);

// Bytes of one element of `dtype`; 0 for a dtype the transport does not carry.
using ElementSizeOf = std::function<int64_t(int64_t dtype)>;

// Reads kWireHeaderWords words. DataLoss naming the first word that is out of range.
absl::StatusOr<WireHeader> DecodeWireHeader(const int64_t* words,
                                            const ElementSizeOf& element_size);

}  // namespace pipetrain::transport
