#include "runtime/transport/wire_header.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::transport {

void EncodeWireHeader(const WireHeader& header, int64_t* words) {
  std::fill(words, words + kWireHeaderWords, 0);
  words[0] = header.kind;
  words[1] = header.micro_batch;
  words[2] = header.dtype;
  words[3] = static_cast<int64_t>(header.shape.size());
  words[4] = header.inline_payload ? 1 : 0;
  std::copy(header.shape.begin(), header.shape.end(), words + 5);
}

absl::StatusOr<WireHeader> DecodeWireHeader(const int64_t* words,
                                            const ElementSizeOf& element_size) {
  auto malformed = [](auto... what) {
    return absl::DataLossError(absl::StrCat("malformed message header: ", what...));
  };
  WireHeader h;
  h.kind = words[0];
  if (h.kind < 0 || h.kind >= kWireMessageKinds) return malformed("kind ", h.kind);
  h.micro_batch = words[1];
  if (h.micro_batch < 0) return malformed("micro-batch ", h.micro_batch);
  h.dtype = words[2];
  const int64_t element_bytes = element_size(h.dtype);
  if (element_bytes <= 0) return malformed("dtype ", h.dtype);
  const int64_t ndim = words[3];
  if (ndim < 0 || ndim > kWireMaxDims) {
    return malformed("ndim ", ndim, " (at most ", kWireMaxDims, ")");
  }
  if (words[4] != 0 && words[4] != 1) return malformed("inline flag ", words[4]);
  h.inline_payload = words[4] == 1;
  int64_t elements = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t size = words[5 + d];
    if (size < 0) return malformed("dim ", d, " is ", size);
    if (size > 0 && elements > kWireMaxElements / size) {
      return malformed("more than 2^40 elements");
    }
    elements *= size;
    h.shape.push_back(size);
  }
  for (int w = 5 + static_cast<int>(ndim); w < kWireHeaderWords; ++w) {
    if (words[w] != 0) return malformed("word ", w, " past the dims is ", words[w]);
  }
  h.payload_bytes = elements * element_bytes;
  return h;
}

}  // namespace pipetrain::transport
