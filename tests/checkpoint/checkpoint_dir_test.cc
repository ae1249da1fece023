// Checkpoint directories on a real file system: a commit is all or nothing, `latest` always
// names a complete checkpoint, K are kept, a flipped byte or a failed write never costs an
// earlier checkpoint, and the manifest reader refuses what it cannot trust.
#include "runtime/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/checkpoint/manifest.h"
#include "runtime/checkpoint/sha256.h"

namespace pipetrain::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

class CheckpointDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("pipetrain_ckpt_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A checkpoint of `layers` layers at `step`, each file `bytes` long; the commit's status.
  absl::Status Write(int64_t step, int layers = 3, int keep = 0, size_t bytes = 100) {
    auto writer = CheckpointWriter::Begin(root_.string(), step);
    if (!writer.ok()) return writer.status();
    Manifest m = TwoStageManifest(step, layers);
    for (int l = 0; l < layers; ++l) {
      auto file = (*writer)->WriteLayer(l, std::string(bytes, static_cast<char>('a' + l + step)));
      if (!file.ok()) return file.status();
      m.files.push_back(*file);
    }
    return (*writer)->Commit(m, keep);
  }

  static Manifest TwoStageManifest(int64_t step, int layers) {
    Manifest m;
    m.step = step;
    m.num_layers = layers;
    m.job = R"({"model":{"name":"mlp"}})";
    m.layout.stages = 2;
    m.layout.stage_layers = {{0, 1}, {1, layers}};
    m.layout.micro_batches = 4;
    m.layout.micro_batch_size = 2;
    m.global_batch_size = 8;
    m.samples_seen = 8 * step;
    return m;
  }

  std::string Latest() const { return Slurp(root_ / "latest"); }

  fs::path root_;
};

TEST_F(CheckpointDirTest, ACommittedCheckpointIsFoundWithEveryFileChecked) {
  ASSERT_TRUE(Write(10).ok());
  EXPECT_EQ(Latest(), "step-00000010\n");
  EXPECT_FALSE(fs::exists(root_ / "step-00000010.tmp"));
  auto found = FindCheckpoint(root_.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 10);
  EXPECT_EQ(found->dir, (root_ / "step-00000010").string());
  EXPECT_TRUE(found->skipped.empty());
  auto layer = ReadLayer(*found, 2);
  ASSERT_TRUE(layer.ok());
  EXPECT_EQ(*layer, std::string(100, 'a' + 2 + 10));
  // The directory itself names one checkpoint.
  EXPECT_TRUE(FindCheckpoint((root_ / "step-00000010").string()).ok());
}

// The process's resident high-water mark, reset first by ResetPeakResident (Linux 4.0 on:
// "5" written to /proc/self/clear_refs).
int64_t PeakResidentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}
bool ResetPeakResident() {
  return static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5");
}

// A layer whose manifest says 512 MiB and whose bytes are not the ones hashed there (a 3 GiB
// one was once read whole before its SHA-256 check failed: +3.1 GB): a file of another size
// is refused before a byte is read, and one of the right size is hashed as it streams,
// never held whole. The negative control: ReadLayer, which returns the bytes, holds them.
TEST_F(CheckpointDirTest, ALayerIsCheckedBySizeFirstAndHashedAsItStreams) {
  ASSERT_TRUE(Write(10).ok());
  const fs::path dir = root_ / "step-00000010";
  const fs::path layer = dir / LayerFileName(1);
  constexpr int64_t kBig = int64_t{512} << 20;
  absl::StatusOr<Manifest> m = ParseManifest(Slurp(dir / "manifest.json"));
  ASSERT_TRUE(m.ok()) << m.status();
  m->files[1].bytes = kBig;  // the bytes below hash to something else
  std::ofstream(dir / "manifest.json", std::ios::trunc) << ManifestToJson(*m);
  // Another size: refused at once, naming both sizes.
  absl::StatusOr<FoundCheckpoint> small = OpenCheckpoint(dir.string());
  ASSERT_TRUE(small.ok()) << small.status();
  absl::Status wrong_size = VerifyLayer(*small, 1);
  EXPECT_TRUE(absl::IsDataLoss(wrong_size)) << wrong_size;
  EXPECT_THAT(wrong_size.message(), HasSubstr("is 100 bytes where 536870912 are expected"));
  // The right size (a sparse file), the wrong bytes: streamed through the hash.
  fs::resize_file(layer, kBig);
  ASSERT_TRUE(ResetPeakResident());
  const int64_t before = PeakResidentBytes();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<FoundCheckpoint> found = FindCheckpoint(dir.string());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(found.ok());
  EXPECT_THAT(found.status().message(), HasSubstr("its SHA-256 is not the manifest's"));
  const int64_t grew = PeakResidentBytes() - before;
  std::printf("a 512 MiB layer checked in %.2f s; the peak resident memory grew %.1f MB\n", seconds,
              grew / 1e6);
  EXPECT_LT(grew, int64_t{16} << 20) << "the layer was held whole to be checked";
  // Negative control: reading the layer's bytes holds them, and the measure shows it.
  ASSERT_TRUE(ResetPeakResident());
  const int64_t reading = PeakResidentBytes();
  absl::StatusOr<std::string> bytes = ReadLayer(*small, 1);
  EXPECT_FALSE(bytes.ok());
  EXPECT_GT(PeakResidentBytes() - reading, kBig / 2);
}

TEST_F(CheckpointDirTest, TheLastKAreKeptAndLatestIsTheNewest) {
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(Write(step, 3, /*keep=*/2).ok());
  EXPECT_FALSE(fs::exists(root_ / "step-00000010"));
  EXPECT_FALSE(fs::exists(root_ / "step-00000020"));
  EXPECT_TRUE(fs::exists(root_ / "step-00000030"));
  EXPECT_TRUE(fs::exists(root_ / "step-00000040"));
  EXPECT_EQ(Latest(), "step-00000040\n");
}

// A flipped byte in the newest checkpoint: resume falls back to the previous one and says why.
TEST_F(CheckpointDirTest, AFlippedByteFallsBackToThePreviousCheckpointAndSaysSo) {
  ASSERT_TRUE(Write(10).ok());
  ASSERT_TRUE(Write(20).ok());
  const fs::path file = root_ / "step-00000020" / LayerFileName(1);
  std::string bytes = Slurp(file);
  bytes[50] ^= 0x01;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  auto found = FindCheckpoint(root_.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 10);
  ASSERT_EQ(found->skipped.size(), 1u);
  EXPECT_THAT(found->skipped[0], HasSubstr("step-00000020"));
  EXPECT_THAT(found->skipped[0], HasSubstr("SHA-256"));
  // Named directly, the corrupt one is refused.
  auto named = FindCheckpoint((root_ / "step-00000020").string());
  EXPECT_EQ(named.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(named.status().message(), HasSubstr("SHA-256"));
  // A truncated file too.
  fs::resize_file(root_ / "step-00000010" / LayerFileName(0), 10);
  auto none = FindCheckpoint(root_.string());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("is 10 bytes where 100 are expected"));
}

// A write that fails (here: the file-size limit, the error a full disk gives as ENOSPC)
// removes the partial directory and leaves `latest` and the earlier checkpoint intact.
TEST_F(CheckpointDirTest, AFailedWriteLeavesLatestAndThePreviousCheckpointIntact) {
  ASSERT_TRUE(Write(10).ok());
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status failed = Write(20, 3, 0, /*bytes=*/8192);
  setrlimit(RLIMIT_FSIZE, &old);
  sigaction(SIGXFSZ, &previous, nullptr);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.message(), HasSubstr("File too large"));
  EXPECT_FALSE(fs::exists(root_ / "step-00000020.tmp"));
  EXPECT_FALSE(fs::exists(root_ / "step-00000020"));
  EXPECT_EQ(Latest(), "step-00000010\n");
  auto found = FindCheckpoint(root_.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 10);
}

// A writer killed mid-way leaves step-N.tmp: never taken for a checkpoint, removed by the
// next writer of that step.
TEST_F(CheckpointDirTest, APartialDirectoryIsNeverACheckpoint) {
  ASSERT_TRUE(Write(10).ok());
  fs::create_directories(root_ / "step-00000020.tmp");
  std::ofstream(root_ / "step-00000020.tmp" / LayerFileName(0)) << "half";
  fs::create_directories(root_ / "step-00000030");  // no manifest: an impostor
  auto found = FindCheckpoint(root_.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 10);
  ASSERT_TRUE(Write(20).ok());
  EXPECT_FALSE(fs::exists(root_ / "step-00000020.tmp"));
  EXPECT_EQ(FindCheckpoint(root_.string())->manifest.step, 20);
  EXPECT_EQ(FindCheckpoint((root_ / "nothing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

// A process SIGKILLed while it writes a checkpoint (files of many MB, one after another):
// `latest` and every complete checkpoint stay intact and loadable; the partial step-N.tmp is
// never taken for one, and the next writer of that step replaces it.
TEST_F(CheckpointDirTest, AWriterKilledMidWriteLeavesEveryCompleteCheckpointLoadable) {
  ASSERT_TRUE(Write(10).ok());
  ASSERT_TRUE(Write(20).ok());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto writer = CheckpointWriter::Begin(root_.string(), 30);
    if (!writer.ok()) _exit(2);
    for (int layer = 0;; ++layer) {  // until killed
      (void)(*writer)->WriteLayer(layer % 64, std::string(size_t{8} << 20, 'x'));
    }
  }
  // Killed once it has written at least one file and is on the next.
  const fs::path tmp = root_ / "step-00000030.tmp";
  for (int i = 0; i < 2000 && !fs::exists(tmp / LayerFileName(1)); ++i) usleep(5000);
  ASSERT_TRUE(fs::exists(tmp / LayerFileName(1)));
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(Latest(), "step-00000020\n");
  for (const char* dir : {"step-00000010", "step-00000020"}) {
    auto found = FindCheckpoint((root_ / dir).string());
    ASSERT_TRUE(found.ok()) << found.status();
    for (int layer = 0; layer < 3; ++layer) EXPECT_TRUE(ReadLayer(*found, layer).ok()) << dir;
  }
  auto found = FindCheckpoint(root_.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 20);
  EXPECT_TRUE(found->skipped.empty());
  ASSERT_TRUE(Write(30).ok());
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(FindCheckpoint(root_.string())->manifest.step, 30);
}

// Writers in several processes join one step-N.tmp (nothing removed); the commit leaves
// `latest` on a newer checkpoint (a job resumed from an older one writes below it) and removes
// the step-M.tmp of earlier steps that dead writers left.
TEST_F(CheckpointDirTest, JoinedWritersShareOneDirectoryAndLatestNeverGoesBack) {
  ASSERT_TRUE(Write(40).ok());
  fs::create_directories(root_ / "step-00000005.tmp");
  auto a = CheckpointWriter::Join(root_.string(), 20);
  auto b = CheckpointWriter::Join(root_.string(), 20);
  ASSERT_TRUE(a.ok() && b.ok());
  Manifest m = TwoStageManifest(20, 2);
  auto f0 = (*a)->WriteLayer(0, "layer zero");
  auto f1 = (*b)->WriteLayer(1, "layer one");
  ASSERT_TRUE(f0.ok() && f1.ok());
  (*a)->Release();  // a's part is done; b commits both
  EXPECT_TRUE(fs::exists(root_ / "step-00000020.tmp" / LayerFileName(0)));
  m.files = {*f0, *f1};
  ASSERT_TRUE((*b)->Commit(m, 0).ok());
  EXPECT_EQ(Latest(), "step-00000040\n");
  EXPECT_FALSE(fs::exists(root_ / "step-00000005.tmp"));
  auto found = FindCheckpoint((root_ / "step-00000020").string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*ReadLayer(*found, 1), "layer one");
  // Opened by its manifest alone (no file read), each layer still checked when read.
  auto opened = OpenCheckpoint((root_ / "step-00000020").string());
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::ofstream(root_ / "step-00000020" / LayerFileName(0), std::ios::trunc) << "layer Zero";
  EXPECT_THAT(ReadLayer(*opened, 0).status().message(), HasSubstr("SHA-256"));
}

// Writers under different tags (two generations, or a cut-off rank and the survivors writing
// in its place) never share a directory: what the fenced-out writer writes, even after the
// others began, is not in the checkpoint they commit, and their commit removes its directory.
// The negative control: under one tag, the same late write lands in the committed checkpoint.
TEST_F(CheckpointDirTest, WritersUnderAnotherTagNeverWriteIntoTheCommittedCheckpoint) {
  for (const bool same_tag : {false, true}) {
    SCOPED_TRACE(same_tag ? "one tag (the negative control)" : "two tags");
    fs::remove_all(root_);
    const std::string fenced_tag = same_tag ? "gen-3-survivors" : "gen-3";
    auto survivors = CheckpointWriter::Join(root_.string(), 80, "gen-3-survivors");
    auto fenced = CheckpointWriter::Join(root_.string(), 80, fenced_tag);
    ASSERT_TRUE(survivors.ok() && fenced.ok());
    EXPECT_EQ(fs::path((*survivors)->tmp_dir()).filename(), "step-00000080.gen-3-survivors.tmp");
    auto f0 = (*survivors)->WriteLayer(0, "the survivors' layer zero");
    auto f1 = (*survivors)->WriteLayer(1, "the survivors' layer one");
    ASSERT_TRUE(f0.ok() && f1.ok());
    ASSERT_TRUE((*fenced)->WriteLayer(1, "a stale layer one").ok());  // after theirs
    (*fenced)->Release();
    Manifest m = TwoStageManifest(80, 2);
    m.files = {*f0, *f1};
    absl::Status committed = (*survivors)->Commit(m, 0);
    auto found = FindCheckpoint(root_.string());
    if (same_tag) {
      // The stale bytes replaced the survivors' file: the checkpoint no longer checks.
      EXPECT_FALSE(found.ok() && *ReadLayer(*found, 1) == "the survivors' layer one");
      continue;
    }
    ASSERT_TRUE(committed.ok()) << committed;
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(found->dir, (root_ / "step-00000080").string());
    EXPECT_EQ(*ReadLayer(*found, 1), "the survivors' layer one");
    EXPECT_FALSE(fs::exists(root_ / "step-00000080.gen-3.tmp")) << "the fenced-out directory";
  }
}

TEST_F(CheckpointDirTest, AWritersTagIsLettersDigitsAndDashes) {
  for (const std::string tag :
       std::vector<std::string>{"../up", "a/b", "gen 3", std::string(65, 'a')}) {
    auto w = CheckpointWriter::Join(root_.string(), 10, tag);
    ASSERT_FALSE(w.ok()) << tag;
    EXPECT_TRUE(absl::IsInvalidArgument(w.status())) << w.status();
  }
  EXPECT_TRUE(CheckpointWriter::Join(root_.string(), 10, "gen-12-survivors").ok());
}

// Replaces `path` (a file) with a FIFO nobody writes to.
void MakeFifo(const fs::path& path) {
  fs::remove(path);
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
}

// `call` returns within 2 s. Should a reader block in open() on the FIFO, a writer opens it
// every 5 s so that the test fails instead of hanging.
template <typename F>
void ReturnsPromptly(const fs::path& fifo, F call) {
  std::atomic<bool> done{false};
  std::thread rescuer([&] {
    for (int tick = 1; !done; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (tick % 50 == 0) close(open(fifo.c_str(), O_WRONLY | O_NONBLOCK));  // wakes a reader
    }
  });
  const auto start = std::chrono::steady_clock::now();
  call();
  done = true;
  rescuer.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0)
      << "blocked on " << fifo;
}

// A FIFO (or anything not a regular file) in place of a manifest, `latest` or a layer file is
// refused at once, naming it; nothing blocks. The checkpoint before it is used.
TEST_F(CheckpointDirTest, AFifoInACheckpointIsRefusedWithoutBlocking) {
  ASSERT_TRUE(Write(10).ok());
  ASSERT_TRUE(Write(20).ok());
  const fs::path manifest = root_ / "step-00000020" / "manifest.json";
  MakeFifo(manifest);
  ReturnsPromptly(manifest, [&] {
    auto named = FindCheckpoint((root_ / "step-00000020").string());
    ASSERT_FALSE(named.ok());
    EXPECT_THAT(named.status().message(), HasSubstr("is not a regular file"));
    auto found = FindCheckpoint(root_.string());
    ASSERT_TRUE(found.ok()) << found.status();
    EXPECT_EQ(found->manifest.step, 10);
    auto opened = OpenCheckpoint((root_ / "step-00000020").string());
    ASSERT_FALSE(opened.ok());
    EXPECT_THAT(opened.status().message(), HasSubstr("is not a regular file"));
  });
  const fs::path layer = root_ / "step-00000010" / LayerFileName(1);
  MakeFifo(layer);
  ReturnsPromptly(layer, [&] {
    auto opened = OpenCheckpoint((root_ / "step-00000010").string());
    ASSERT_TRUE(opened.ok()) << opened.status();
    auto read = ReadLayer(*opened, 1);
    ASSERT_FALSE(read.ok());
    EXPECT_THAT(read.status().message(), HasSubstr(layer.string() + "' is not a regular file"));
  });
  MakeFifo(root_ / "latest");
  ReturnsPromptly(root_ / "latest", [&] {
    auto found = FindCheckpoint(root_.string());  // nothing left intact, and nothing blocks
    EXPECT_FALSE(found.ok());
  });
  // A writer never blocks on a FIFO left where it writes either.
  ReturnsPromptly(root_ / "latest", [&] { EXPECT_TRUE(Write(30).ok()); });
}

// A manifest that declares a layer larger than kMaxFileBytes is refused before anything is
// read (a sparse 2^40-byte layer once asked for 1 TiB of memory: a bare bad_alloc).
TEST_F(CheckpointDirTest, ALayerDeclaredLargerThanTheBoundIsRefusedBeforeItIsRead) {
  ASSERT_TRUE(Write(10, 3, 0, 100).ok());
  const fs::path dir = root_ / "step-00000010";
  std::string manifest = Slurp(dir / "manifest.json");
  const size_t key = manifest.find("\"bytes\"");
  ASSERT_NE(key, std::string::npos) << manifest;
  const size_t at = manifest.find("100", key);
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.replace(at, 3, "1099511627776");
  std::ofstream(dir / "manifest.json", std::ios::binary | std::ios::trunc) << manifest;
  fs::resize_file(dir / LayerFileName(0), int64_t{1} << 40);  // sparse: no disk used
  auto found = FindCheckpoint(dir.string());
  ASSERT_FALSE(found.ok());
  EXPECT_THAT(found.status().message(), HasSubstr("bytes"));
  EXPECT_THAT(found.status().message(), HasSubstr(std::to_string(kMaxFileBytes)));
}

TEST(Manifest, RoundTripsAndRefusesWhatItCannotTrust) {
  Manifest m;
  m.step = 5;
  m.num_layers = 2;
  m.job = R"({"steps":20})";
  m.layout.stage_layers = {{0, 2}};
  m.global_batch_size = 4;
  m.samples_seen = 20;
  for (int l = 0; l < 2; ++l) m.files.push_back({LayerFileName(l), l, 7, Sha256Hex("x")});
  const std::string text = ManifestToJson(m);
  auto back = ParseManifest(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ManifestToJson(*back), text);

  auto refused = [&](const std::string& from, const std::string& to) {
    std::string bad = text;
    const size_t at = bad.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    bad.replace(at, from.size(), to);
    absl::StatusOr<Manifest> parsed = ParseManifest(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss) << from << " -> " << to;
    return std::string(parsed.status().message());
  };
  EXPECT_THAT(refused("\"format\": 1", "\"format\": 2"), HasSubstr("format 2"));
  EXPECT_THAT(refused("layer-00001.pt", "../etc/passwd"),
              HasSubstr("must be named layer-00001.pt"));
  EXPECT_THAT(refused("\"layer\": 1", "\"layer\": 0"), HasSubstr("layer 1 comes next"));
  EXPECT_THAT(refused("\"samples_seen\": 20", "\"samples_seen\": 21"), HasSubstr("samples_seen"));
  EXPECT_THAT(refused(Sha256Hex("x"), "XYZ"), HasSubstr("sha256"));
  EXPECT_THAT(refused("\"bytes\": 7", "\"bytes\": -7"), HasSubstr("'bytes'"));
  EXPECT_THAT(refused("\"step\": 5", "\"step\": 18446744073709551615"), HasSubstr("'step'"));
  EXPECT_EQ(ParseManifest("[]").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ParseManifest("{").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pipetrain::checkpoint
