// The wire header of Gloo and NCCL messages: what is encoded decodes to itself, and every
// field out of range is refused naming it (the fuzzer, fuzz/wire_header_fuzzer.cc, tries
// the rest).
#include "runtime/transport/wire_header.h"

#include <cstdint>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::transport {
namespace {

using ::testing::HasSubstr;

// dtypes 0..3 of 1, 2, 4 and 8 bytes; anything else not carried.
int64_t FourSizes(int64_t dtype) { return dtype >= 0 && dtype < 4 ? int64_t{1} << dtype : 0; }

TEST(WireHeader, EncodedHeadersDecodeToThemselves) {
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{}, {0}, {8, 32, 64}, {1, 1, 1, 1, 1, 1, 1, 7}}) {
    WireHeader h;
    h.kind = 1;
    h.micro_batch = 12345678901;
    h.dtype = 3;
    h.inline_payload = shape.size() == 3;
    h.shape = shape;
    int64_t words[kWireHeaderWords];
    EncodeWireHeader(h, words);
    absl::StatusOr<WireHeader> back = DecodeWireHeader(words, FourSizes);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->kind, 1);
    EXPECT_EQ(back->micro_batch, 12345678901);
    EXPECT_EQ(back->dtype, 3);
    EXPECT_EQ(back->inline_payload, h.inline_payload);
    EXPECT_EQ(back->shape, shape);
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    EXPECT_EQ(back->payload_bytes, elements * 8);
  }
}

TEST(WireHeader, EveryFieldOutOfRangeIsRefusedNamingIt) {
  struct Case {
    int word;
    int64_t value;
    const char* named;
  };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const Case& c :
       {Case{0, 6, "kind 6"}, Case{0, -1, "kind -1"}, Case{1, -5, "micro-batch -5"},
        Case{2, 4, "dtype 4"}, Case{2, -1, "dtype -1"}, Case{3, 9, "ndim 9"},
        Case{3, -1, "ndim -1"}, Case{4, 2, "inline flag 2"}, Case{5, -3, "dim 0 is -3"},
        Case{6, kMax, "more than 2^40 elements"}, Case{15, 1, "word 15 past the dims"}}) {
    int64_t words[kWireHeaderWords];
    WireHeader h;
    h.dtype = 2;
    h.shape = {4, 4};
    EncodeWireHeader(h, words);
    words[c.word] = c.value;
    absl::StatusOr<WireHeader> decoded = DecodeWireHeader(words, FourSizes);
    ASSERT_FALSE(decoded.ok()) << c.named;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(decoded.status().message(), HasSubstr(c.named));
  }
  // Dims whose product overflows int64 are caught before it does.
  int64_t words[kWireHeaderWords];
  WireHeader h;
  h.shape = {int64_t{1} << 21, int64_t{1} << 21, int64_t{1} << 21};
  EncodeWireHeader(h, words);
  EXPECT_FALSE(DecodeWireHeader(words, FourSizes).ok());
}

}  // namespace
}  // namespace pipetrain::transport
