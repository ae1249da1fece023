// ReadRegularFile (runtime/base/regular_file.h) against what a job may name: a FIFO, a
// device, a directory, a file over the bound, a link out of the read roots, and a link that
// flips between a file inside and one outside while it is read (the check is on what was
// opened, so no read ever returns the outside file's bytes).
#include "runtime/base/regular_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pipetrain_regular_file_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "root");
    SetReadRoots({});
  }
  void TearDown() override {
    SetReadRoots({});
    fs::remove_all(dir_);
  }
  fs::path Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }
  fs::path dir_;
};

TEST_F(RegularFileTest, ReadsARegularFileAndRefusesEverythingElseNamingIt) {
  const fs::path file = Write("root/data.bin", "twelve bytes");
  auto read = ReadRegularFile(file.string(), 100, "byte file");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "twelve bytes");
  auto over = ReadRegularFile(file.string(), 11, "byte file");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over.status().message(),
              HasSubstr("byte file '" + file.string() + "' is 12 B, over the bound of 11 B"));
  const fs::path fifo = dir_ / "root" / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const fs::path& not_regular : {fifo, dir_ / "root", fs::path("/dev/zero")}) {
    auto refused = ReadRegularFile(not_regular.string(), 100, "byte file");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << not_regular;
    EXPECT_THAT(refused.status().message(), HasSubstr("is not a regular file"));
  }
  EXPECT_EQ(ReadRegularFile((dir_ / "none").string(), 100, "x").status().code(),
            absl::StatusCode::kNotFound);
}

// With read roots, a link inside leading out is refused without telling anything of the
// file it leads to (its size once showed through); files inside, through links too, are read.
TEST_F(RegularFileTest, ReadRootsRefuseWhatWasOpenedOutsideThem) {
  const fs::path inside = Write("root/inside.txt", "inside");
  const fs::path outside = Write("outside.txt", "the outside file, 35 bytes long....");
  fs::create_symlink(outside, dir_ / "root" / "out");
  fs::create_symlink(inside, dir_ / "root" / "in");
  SetReadRoots({(dir_ / "root").string()});
  auto out = ReadRegularFile((dir_ / "root" / "out").string(), 1 << 20, "byte file");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(out.status().message(), HasSubstr("is outside the directories"));
  EXPECT_THAT(out.status().message(), Not(HasSubstr("35")));
  EXPECT_EQ(ReadRegularFile(outside.string(), 1 << 20, "x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(*ReadRegularFile((dir_ / "root" / "in").string(), 100, "x"), "inside");
  EXPECT_EQ(*ReadRegularFile(inside.string(), 100, "x"), "inside");
  SetReadRoots({});
  EXPECT_TRUE(ReadRegularFile((dir_ / "root" / "out").string(), 100, "x").ok());
}

// A link flipped between a file inside the roots and one outside as fast as a thread can,
// while the same path is read 2,000 times: no read returns the outside file. (A check of the
// path before opening it let 1 of 25 jobs read outside.)
TEST_F(RegularFileTest, ALinkFlippedDuringReadsNeverLeadsOutside) {
  const fs::path inside = Write("root/inside.txt", "inside");
  const fs::path outside = Write("outside.txt", "OUTSIDE");
  const fs::path link = dir_ / "root" / "flip";
  fs::create_symlink(inside, link);
  SetReadRoots({(dir_ / "root").string()});
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    const fs::path tmp = dir_ / "root" / "flip.tmp";
    for (bool out = true; !stop; out = !out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      fs::create_symlink(out ? outside : inside, tmp, ec);
      fs::rename(tmp, link, ec);  // atomic: the link always exists
    }
  });
  int read_inside = 0, refused = 0, leaked = 0;
  for (int i = 0; i < 2000; ++i) {
    auto read = ReadRegularFile(link.string(), 100, "byte file");
    if (read.ok()) {
      (*read == "inside" ? read_inside : leaked)++;
    } else if (read.status().code() == absl::StatusCode::kPermissionDenied) {
      ++refused;
    }
  }
  stop = true;
  flipper.join();
  std::fprintf(stderr, "2000 reads: %d inside, %d refused, %d outside\n", read_inside, refused,
               leaked);
  EXPECT_EQ(leaked, 0);
  EXPECT_GT(read_inside + refused, 1900);
}

}  // namespace
}  // namespace pipetrain
