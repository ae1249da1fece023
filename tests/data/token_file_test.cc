#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/data/dataset.h"

namespace pipetrain::data {
namespace {

TokenDataOptions Seq(int64_t seq_len) {
  TokenDataOptions opts;
  opts.seq_len = seq_len;
  return opts;
}

// A path under the test temp dir unique to the running test.
std::string TempPath(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(::testing::TempDir(), "pipetrain_data_", info->test_suite_name(), "_",
                      info->name(), "_", name);
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<uint8_t> LittleEndian(const std::vector<uint16_t>& ids) {
  std::vector<uint8_t> bytes;
  for (uint16_t id : ids) {
    bytes.push_back(static_cast<uint8_t>(id & 0xFF));
    bytes.push_back(static_cast<uint8_t>(id >> 8));
  }
  return bytes;
}

TEST(ByteFileTest, ReadsExactWindows) {
  // 100 bytes: 250, 251, ..., 255, 0, 1, ... (covers bytes >= 128: no sign extension).
  std::vector<uint8_t> bytes(100);
  for (int i = 0; i < 100; ++i) bytes[i] = static_cast<uint8_t>((250 + i) % 256);
  const std::string path = TempPath("bytes.bin");
  WriteBytes(path, bytes);

  auto ds = OpenByteFile(path, Seq(8));
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Dataset& d = **ds;
  EXPECT_TRUE(d.is_token_data());
  EXPECT_EQ(d.num_classes(), 256);
  EXPECT_EQ(d.num_samples(), 99 / 8);  // 12
  EXPECT_EQ(d.sample_shape(), std::vector<int64_t>{8});
  EXPECT_FALSE(d.entropy_nats().has_value());
  EXPECT_TRUE(absl::StrContains(d.Describe(), path)) << d.Describe();

  const MicroBatch b = d.Read({3, 0, 11});
  EXPECT_EQ(b.input_shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(b.target_shape, (std::vector<int64_t>{3, 8}));
  const int64_t rows[] = {3, 0, 11};
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b.input_tokens[r * 8 + t], bytes[rows[r] * 8 + t]);
      EXPECT_EQ(b.targets[r * 8 + t], bytes[rows[r] * 8 + t + 1]);
    }
  }
  EXPECT_EQ(b.input_tokens[0], 250 + 24 - 256);  // byte 24 = (250 + 24) % 256 = 18
  EXPECT_EQ(d.Read({0}).input_tokens[5], 255);
}

TEST(ByteFileTest, MissingFileIsNotFoundNamingPath) {
  const std::string path = TempPath("does_not_exist.bin");
  auto ds = OpenByteFile(path, TokenDataOptions{});
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(ds.status().message(), path)) << ds.status();
}

TEST(ByteFileTest, ADirectoryIsNotARegularFile) {
  auto ds = OpenByteFile(::testing::TempDir(), TokenDataOptions{});
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition) << ds.status();
  EXPECT_TRUE(absl::StrContains(ds.status().message(), "is not a regular file")) << ds.status();
}

// A FIFO named as data is refused at once (it once blocked its reader, and so its worker, for
// good), and so is a file over kMaxTokenFileBytes (an 8 GiB sparse one once ended in a bare
// bad_alloc on every rank), naming the file and the bound, before any byte is read.
TEST(ByteFileTest, AFifoOrAFileOverTheBoundIsRefusedAtOnceNamingIt) {
  const std::string fifo = TempPath("fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> done{false};
  std::thread rescuer([&] {  // should the reader block in open(), it fails instead of hanging
    for (int tick = 1; !done; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (tick % 50 == 0) close(open(fifo.c_str(), O_WRONLY | O_NONBLOCK));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  auto from_fifo = OpenUint16TokenFile(fifo, Seq(4));
  done = true;
  rescuer.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
  EXPECT_EQ(from_fifo.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(from_fifo.status().message(),
                                "uint16 token file '" + fifo + "' is not a regular file"))
      << from_fifo.status();
  std::remove(fifo.c_str());
  const std::string huge = TempPath("huge.bin");
  WriteBytes(huge, {1, 2, 3});
  std::filesystem::resize_file(huge, kMaxTokenFileBytes + 1);  // sparse: no disk used
  auto from_huge = OpenByteFile(huge, Seq(4));
  EXPECT_EQ(from_huge.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(from_huge.status().message(), huge)) << from_huge.status();
  EXPECT_TRUE(absl::StrContains(from_huge.status().message(), "over the bound of 16.0 GiB"))
      << from_huge.status();
  std::remove(huge.c_str());
}

TEST(ByteFileTest, TooShortIsInvalidArgumentNamingPath) {
  const std::string path = TempPath("short.bin");
  WriteBytes(path, std::vector<uint8_t>(8, 7));  // seq_len 8 needs 9 bytes
  auto ds = OpenByteFile(path, Seq(8));
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(ds.status().message(), path)) << ds.status();

  WriteBytes(path, {});
  EXPECT_EQ(OpenByteFile(path, Seq(8)).status().code(), absl::StatusCode::kInvalidArgument);

  // Exactly one window.
  WriteBytes(path, std::vector<uint8_t>(9, 7));
  auto one = OpenByteFile(path, Seq(8));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->num_samples(), 1);
}

TEST(Uint16TokenFileTest, ReadsLittleEndianIdsExactly) {
  // 513 = 0x0201 tells the byte order apart; 40000 > 32767 rules out sign extension.
  const std::vector<uint16_t> ids = {513, 1, 40000, 0, 2, 7, 513, 255, 256, 3, 9};
  const std::string path = TempPath("ids.u16");
  WriteBytes(path, LittleEndian(ids));
  auto ds = OpenUint16TokenFile(path, Seq(4));
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Dataset& d = **ds;
  EXPECT_EQ(d.num_classes(), 40001);  // inferred: max id + 1
  EXPECT_EQ(d.num_samples(), (11 - 1) / 4);
  EXPECT_TRUE(absl::StrContains(d.Describe(), path)) << d.Describe();
  const MicroBatch b = d.Read({1, 0});
  EXPECT_EQ(b.input_tokens, (std::vector<int64_t>{2, 7, 513, 255, 513, 1, 40000, 0}));
  EXPECT_EQ(b.targets, (std::vector<int64_t>{7, 513, 255, 256, 1, 40000, 0, 2}));
}

TEST(Uint16TokenFileTest, GivenVocabIsUsedAndEnforced) {
  const std::vector<uint16_t> ids = {1, 2, 3, 4, 5, 1000, 6, 7, 8};
  const std::string path = TempPath("ids.u16");
  WriteBytes(path, LittleEndian(ids));

  auto big = OpenUint16TokenFile(path, Seq(4), 5000);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ((*big)->num_classes(), 5000);

  auto exact = OpenUint16TokenFile(path, Seq(4), 1001);
  ASSERT_TRUE(exact.ok()) << exact.status();

  auto small = OpenUint16TokenFile(path, Seq(4), 1000);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  // Token 5 is at byte offset 10.
  EXPECT_TRUE(absl::StrContains(small.status().message(), "offset 10")) << small.status();
  EXPECT_TRUE(absl::StrContains(small.status().message(), "1000")) << small.status();
  EXPECT_TRUE(absl::StrContains(small.status().message(), path)) << small.status();
}

TEST(Uint16TokenFileTest, OddLengthIsInvalidArgument) {
  std::vector<uint8_t> bytes = LittleEndian({1, 2, 3, 4, 5, 6});
  bytes.push_back(0);
  const std::string path = TempPath("odd.u16");
  WriteBytes(path, bytes);
  auto ds = OpenUint16TokenFile(path, Seq(2));
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(ds.status().message(), "odd")) << ds.status();
  EXPECT_TRUE(absl::StrContains(ds.status().message(), path)) << ds.status();
}

TEST(Uint16TokenFileTest, MissingAndTooShort) {
  const std::string missing = TempPath("missing.u16");
  auto ds = OpenUint16TokenFile(missing, TokenDataOptions{});
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(ds.status().message(), missing)) << ds.status();

  const std::string path = TempPath("short.u16");
  WriteBytes(path, LittleEndian({1, 2, 3, 4}));  // seq_len 4 needs 5 ids
  auto short_ds = OpenUint16TokenFile(path, Seq(4));
  EXPECT_EQ(short_ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(short_ds.status().message(), path)) << short_ds.status();

  EXPECT_EQ(OpenUint16TokenFile(path, Seq(2), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::data
