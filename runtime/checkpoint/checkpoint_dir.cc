#include "runtime/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/status_macros.h"
#include "runtime/checkpoint/sha256.h"

namespace pipetrain::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kManifest[] = "manifest.json";
constexpr char kLatest[] = "latest";

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Writes `bytes` to `path` (created or truncated; a regular file, never a FIFO or a device
// someone left there: opened without blocking or following a link, checked on the
// descriptor) and fsyncs it.
absl::Status WriteAll(const std::string& path, const std::string& bytes) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0) return Errno("cannot create", path);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || ftruncate(fd, 0) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": not a regular file"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      absl::Status s = Errno("writing", path);
      close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    absl::Status s = Errno("flushing", path);
    close(fd);
    return s;
  }
  if (close(fd) != 0) return Errno("closing", path);
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = fsync(fd);
  absl::Status s = rc == 0 ? absl::OkStatus() : Errno("flushing directory", dir);
  close(fd);
  return s;
}

// The whole file, if it is a regular file of at most `limit` bytes (never blocking on a FIFO).
absl::StatusOr<std::string> ReadAll(const std::string& path, int64_t limit, const char* what) {
  absl::StatusOr<std::string> bytes = ReadRegularFile(path, limit, what);
  if (!bytes.ok() && absl::IsFailedPrecondition(bytes.status())) {
    return absl::DataLossError(bytes.status().message());
  }
  return bytes;
}

// The step of a directory named step-N (nullopt for anything else).
std::optional<int64_t> StepOfName(const std::string& name) {
  absl::string_view rest = name;
  int64_t step = 0;
  if (!absl::ConsumePrefix(&rest, "step-") || rest.empty() ||
      rest.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(rest, &step)) {
    return std::nullopt;
  }
  return step;
}

// The temporary directory of writers tagged `tag` at `step`: step-N.tmp, step-N.TAG.tmp.
std::string TmpDirName(int64_t step, const std::string& tag) {
  return tag.empty() ? StepDirName(step) + ".tmp"
                     : absl::StrCat(StepDirName(step), ".", tag, ".tmp");
}

bool ValidTag(const std::string& tag) {
  return tag.size() <= 64 && std::all_of(tag.begin(), tag.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-';
         });
}

// The step of a temporary directory's name (step-N.tmp or step-N.TAG.tmp), or nullopt.
std::optional<int64_t> StepOfTmpDir(const std::string& name) {
  absl::string_view rest = name;
  if (!absl::ConsumeSuffix(&rest, ".tmp")) return std::nullopt;
  return StepOfName(std::string(rest.substr(0, rest.find('.'))));
}

// An exclusive flock on ROOT/.commit-lock while it lives: one commit under ROOT at a time,
// among threads and processes (the lock is the open file's; it ends with the process too).
class CommitLock {
 public:
  static absl::StatusOr<CommitLock> Take(const std::string& root) {
    const std::string path = (fs::path(root) / ".commit-lock").string();
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("cannot open", path);
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("cannot lock", path);
      ::close(fd);
      return s;
    }
    return CommitLock(fd);
  }
  CommitLock(CommitLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  CommitLock& operator=(CommitLock&&) = delete;
  ~CommitLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }

 private:
  explicit CommitLock(int fd) : fd_(fd) {}
  int fd_;
};

// Complete checkpoints under `root` (step-N directories), by step.
std::map<int64_t, std::string> CompleteCheckpoints(const std::string& root) {
  std::map<int64_t, std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (auto step = StepOfName(entry.path().filename().string()); step && entry.is_directory(ec)) {
      out[*step] = entry.path().string();
    }
  }
  return out;
}

// The manifest of `dir`, and every file checked against it.
absl::StatusOr<Manifest> Check(const std::string& dir) {
  auto text =
      ReadAll((fs::path(dir) / kManifest).string(), kMaxManifestBytes, "checkpoint manifest");
  if (!text.ok()) return text.status();
  auto manifest = ParseManifest(*text);
  if (!manifest.ok()) return manifest.status();
  if (auto step = StepOfName(fs::path(dir).filename().string()); step && *step != manifest->step) {
    return absl::DataLossError(absl::StrCat("its manifest says step ", manifest->step));
  }
  FoundCheckpoint found{dir, *manifest, {}};
  for (int layer = 0; layer < manifest->num_layers; ++layer) {
    PT_RETURN_IF_ERROR(VerifyLayer(found, layer));
  }
  return manifest;
}

}  // namespace

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

CheckpointWriter::CheckpointWriter(std::string root, int64_t step, const std::string& tag)
    : root_(std::move(root)), step_(step) {
  tmp_ = (fs::path(root_) / TmpDirName(step_, tag)).string();
  final_ = (fs::path(root_) / StepDirName(step_)).string();
}

CheckpointWriter::~CheckpointWriter() {
  if (!done_) Abort();
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Begin(const std::string& root,
                                                                          int64_t step) {
  if (step < 1) return absl::InvalidArgumentError("a checkpoint is taken before step >= 1");
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter(root, step, ""));
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  fs::remove_all(w->tmp_, ec);  // a writer that died before its commit
  if (!fs::create_directory(w->tmp_, ec) || ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", w->tmp_, ": ", ec.message()));
  }
  return w;
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Join(const std::string& root,
                                                                         int64_t step,
                                                                         const std::string& tag) {
  if (step < 1) return absl::InvalidArgumentError("a checkpoint is taken before step >= 1");
  if (!ValidTag(tag)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint writers' tag \"", tag, "\": only letters, digits and '-' (at most 64)"));
  }
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter(root, step, tag));
  std::error_code ec;
  fs::create_directories(w->tmp_, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("cannot create ", w->tmp_, ": ", ec.message()));
  return w;
}

absl::StatusOr<LayerFile> CheckpointWriter::WriteLayer(int layer, const std::string& bytes) {
  LayerFile file;
  file.name = LayerFileName(layer);
  file.layer = layer;
  file.bytes = static_cast<int64_t>(bytes.size());
  file.sha256 = Sha256Hex(bytes);
  absl::Status written = WriteAll((fs::path(tmp_) / file.name).string(), bytes);
  if (!written.ok()) return written;
  return file;
}

absl::Status CheckpointWriter::Commit(const Manifest& manifest, int keep) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  auto fail = [this](absl::Status s) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
    return s;
  };
  if (manifest.step != step_) {
    return fail(absl::InternalError(
        absl::StrCat("a manifest for step ", manifest.step, " in the checkpoint of step ", step_)));
  }
  if (absl::Status s = WriteAll((fs::path(tmp_) / kManifest).string(), ManifestToJson(manifest));
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = FsyncDir(tmp_); !s.ok()) return fail(s);
  absl::StatusOr<CommitLock> locked = CommitLock::Take(root_);
  if (!locked.ok()) return fail(locked.status());
  std::error_code ec;
  fs::remove_all(final_, ec);  // the same step written again (a resumed job, the survivors)
  if (std::rename(tmp_.c_str(), final_.c_str()) != 0) return fail(Errno("cannot rename", tmp_));
  if (absl::Status s = FsyncDir(root_); !s.ok()) return s;
  const std::string latest = (fs::path(root_) / kLatest).string();
  bool newer_exists = false;  // then `latest` stays on the newer one
  if (auto named = ReadAll(latest, 256, "checkpoint pointer"); named.ok()) {
    auto newer = StepOfName(std::string(absl::StripTrailingAsciiWhitespace(*named)));
    newer_exists =
        newer && *newer > step_ && fs::is_directory(fs::path(root_) / StepDirName(*newer), ec);
  }
  if (!newer_exists) {
    const std::string latest_tmp = latest + ".tmp";
    if (absl::Status s = WriteAll(latest_tmp, StepDirName(step_) + "\n"); !s.ok()) {
      std::remove(latest_tmp.c_str());
      return s;
    }
    if (std::rename(latest_tmp.c_str(), latest.c_str()) != 0) {
      absl::Status s = Errno("cannot replace", latest);
      std::remove(latest_tmp.c_str());
      return s;
    }
    if (absl::Status s = FsyncDir(root_); !s.ok()) return s;
  }
  if (keep > 0) {
    std::map<int64_t, std::string> complete = CompleteCheckpoints(root_);
    while (static_cast<int>(complete.size()) > keep && complete.begin()->first != step_) {
      fs::remove_all(complete.begin()->second, ec);
      complete.erase(complete.begin());
    }
  }
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    if (!entry.is_directory(ec)) continue;
    const std::optional<int64_t> step = StepOfTmpDir(entry.path().filename().string());
    if (step && *step <= step_) fs::remove_all(entry.path(), ec);  // ours is renamed already
  }
  return absl::OkStatus();
}

void CheckpointWriter::Abort() {
  done_ = true;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

namespace {

// The layer's file, streamed to `consume` and hashed as it goes: its size against the
// manifest's before any byte is read, its SHA-256 once every byte was.
absl::Status StreamLayer(const FoundCheckpoint& found, int layer,
                         const std::function<void(absl::string_view)>& consume) {
  if (layer < 0 || layer >= static_cast<int>(found.manifest.files.size())) {
    return absl::InvalidArgumentError(absl::StrCat("no layer ", layer, " in ", found.dir));
  }
  const LayerFile& f = found.manifest.files[layer];
  const std::string path = (fs::path(found.dir) / f.name).string();
  Sha256 hash;
  absl::Status read =
      StreamRegularFile(path, f.bytes, "checkpoint layer", [&](absl::string_view piece) {
        hash.Add(std::string_view(piece.data(), piece.size()));
        consume(piece);
      });
  if (!read.ok()) {
    // A file of another size, or not a regular one: the checkpoint is damaged.
    return absl::IsFailedPrecondition(read) || absl::IsDataLoss(read)
               ? absl::DataLossError(read.message())
               : read;
  }
  if (hash.Hex() != f.sha256) {
    return absl::DataLossError(absl::StrCat(path, ": its SHA-256 is not the manifest's"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadLayer(const FoundCheckpoint& found, int layer) {
  std::string bytes;
  if (layer >= 0 && layer < static_cast<int>(found.manifest.files.size())) {
    try {
      bytes.reserve(static_cast<size_t>(found.manifest.files[layer].bytes));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", found.manifest.files[layer].bytes, " bytes for layer ", layer));
    }
  }
  PT_RETURN_IF_ERROR(StreamLayer(
      found, layer, [&](absl::string_view piece) { bytes.append(piece.data(), piece.size()); }));
  return bytes;
}

absl::Status VerifyLayer(const FoundCheckpoint& found, int layer) {
  return StreamLayer(found, layer, [](absl::string_view) {});
}

absl::StatusOr<FoundCheckpoint> OpenCheckpoint(const std::string& step_dir) {
  auto text =
      ReadAll((fs::path(step_dir) / kManifest).string(), kMaxManifestBytes, "checkpoint manifest");
  if (!text.ok()) return text.status();
  auto manifest = ParseManifest(*text);
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(step_dir, ": ", manifest.status().message()));
  }
  return FoundCheckpoint{step_dir, *std::move(manifest), {}};
}

absl::StatusOr<FoundCheckpoint> FindCheckpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifest, ec)) {  // one checkpoint, named
    auto manifest = Check(path);
    if (!manifest.ok()) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", path, ": ", manifest.status().message()));
    }
    return FoundCheckpoint{path, *std::move(manifest), {}};
  }
  if (fs::path(path).filename() == kLatest && fs::is_regular_file(path, ec)) {
    // The pointer file itself (DIR/latest): its root, which reads it first.
    return FindCheckpoint(fs::path(path).parent_path().string());
  }
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint directory ", path));
  }
  std::vector<std::string> candidates;
  std::vector<std::string> skipped;
  auto latest = ReadAll((fs::path(path) / kLatest).string(), 256, "checkpoint pointer");
  if (latest.ok()) {
    const std::string name(absl::StripTrailingAsciiWhitespace(*latest));
    if (StepOfName(name)) {
      candidates.push_back((fs::path(path) / name).string());
    } else {
      skipped.push_back(absl::StrCat(path, "/latest names no checkpoint"));
    }
  }
  std::map<int64_t, std::string> complete = CompleteCheckpoints(path);
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    if (candidates.empty() || it->second != candidates.front()) candidates.push_back(it->second);
  }
  for (const std::string& dir : candidates) {
    auto manifest = Check(dir);
    if (manifest.ok()) return FoundCheckpoint{dir, *std::move(manifest), std::move(skipped)};
    skipped.push_back(absl::StrCat(dir, ": ", manifest.status().message()));
  }
  return absl::NotFoundError(absl::StrCat(
      "no complete checkpoint under ", path,
      skipped.empty() ? std::string() : absl::StrCat(" (", absl::StrJoin(skipped, "; "), ")")));
}

}  // namespace pipetrain::checkpoint
