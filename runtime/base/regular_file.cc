#include "runtime/base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/byte_size.h"

namespace pipetrain {

namespace {

std::vector<std::string>& Roots() {
  static std::vector<std::string> roots;
  return roots;
}

// Where the descriptor's file lies (absolute, without links); "" if unknown.
std::string OpenedPath(int fd) {
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[PATH_MAX];
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return "";
  return std::string(target, static_cast<size_t>(n));
}

// Opens `path` without blocking and checks, on the descriptor, that it lies under the read
// roots and is a regular file of at most `limit` bytes; the descriptor and its size.
absl::Status OpenChecked(const std::string& path, int64_t limit, absl::string_view what, int* fd,
                         int64_t* size) {
  // O_NONBLOCK: opening a FIFO with no writer, or a device, returns at once.
  *fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (*fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", what, " '", path, "': ", std::strerror(errno)));
  }
  absl::Status refused;
  struct stat st {};
  if (!Roots().empty() && !IsUnderRoots(OpenedPath(*fd), Roots())) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        what, " '", path, "' is outside the directories this process reads jobs' files from (",
        absl::StrJoin(Roots(), ", "), ")"));
  } else if (fstat(*fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    refused =
        absl::FailedPreconditionError(absl::StrCat(what, " '", path, "' is not a regular file"));
  } else if (st.st_size > limit) {
    refused = absl::FailedPreconditionError(
        absl::StrCat(what, " '", path, "' is ", ByteSize(st.st_size), ", over the bound of ",
                     ByteSize(limit), " for one file"));
  }
  if (!refused.ok()) {
    close(*fd);
    *fd = -1;
    return refused;
  }
  *size = st.st_size;
  return absl::OkStatus();
}

// Reads `n` bytes from `fd` into `into`; how many it got (fewer: the file ended).
absl::StatusOr<size_t> ReadUpTo(int fd, char* into, size_t n, const std::string& path,
                                absl::string_view what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = read(fd, into + done, n - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::NotFoundError(
          absl::StrCat("cannot read ", what, " '", path, "': ", std::strerror(errno)));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

template <typename Bytes>
absl::Status ReadInto(const std::string& path, int64_t limit, absl::string_view what, Bytes* out) {
  int fd = -1;
  int64_t size = 0;
  if (absl::Status s = OpenChecked(path, limit, what, &fd, &size); !s.ok()) return s;
  Bytes& bytes = *out;
  try {
    bytes.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", ByteSize(size), " to read ", what, " '", path, "'"));
  }
  absl::StatusOr<size_t> done =
      ReadUpTo(fd, reinterpret_cast<char*>(bytes.data()), bytes.size(), path, what);
  close(fd);
  if (!done.ok()) return done.status();
  if (*done != bytes.size()) {
    return absl::DataLossError(absl::StrCat(what, " '", path, "': short read (", *done, " of ",
                                            bytes.size(), " bytes; it shrank while read)"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ResolvedRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> resolved;
  for (const std::string& root : roots) {
    char buf[PATH_MAX];
    resolved.push_back(realpath(root.c_str(), buf) != nullptr ? std::string(buf) : root);
  }
  return resolved;
}

void SetReadRoots(const std::vector<std::string>& roots) { Roots() = ResolvedRoots(roots); }

std::vector<std::string> ReadRoots() { return Roots(); }

bool IsUnderRoots(const std::string& resolved, const std::vector<std::string>& resolved_roots) {
  if (resolved.empty() || resolved[0] != '/') return false;
  for (const std::string& root : resolved_roots) {
    if (root == "/") return true;
    if (resolved.compare(0, root.size(), root) == 0 &&
        (resolved.size() == root.size() || resolved[root.size()] == '/')) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t limit,
                                            absl::string_view what) {
  std::string bytes;
  absl::Status s = ReadInto(path, limit, what, &bytes);
  if (!s.ok()) return s;
  return bytes;
}

absl::Status ReadRegularFile(const std::string& path, int64_t limit, absl::string_view what,
                             std::vector<uint8_t>* bytes) {
  return ReadInto(path, limit, what, bytes);
}

absl::Status StreamRegularFile(const std::string& path, int64_t size, absl::string_view what,
                               const std::function<void(absl::string_view piece)>& consume) {
  int fd = -1;
  int64_t found = 0;
  // Any size opens; one other than `size` is refused before a byte is read.
  if (absl::Status s = OpenChecked(path, INT64_MAX, what, &fd, &found); !s.ok()) return s;
  if (found != size) {
    close(fd);
    return absl::DataLossError(
        absl::StrCat(what, " '", path, "' is ", found, " bytes where ", size, " are expected"));
  }
  constexpr size_t kPiece = 1 << 20;
  std::unique_ptr<char[]> buffer(new (std::nothrow) char[kPiece]);
  if (buffer == nullptr) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate 1 MiB to read ", what));
  }
  int64_t done = 0;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(kPiece, size - done));
    absl::StatusOr<size_t> got = ReadUpTo(fd, buffer.get(), want, path, what);
    if (!got.ok()) {
      close(fd);
      return got.status();
    }
    if (*got == 0) break;
    consume(absl::string_view(buffer.get(), *got));
    done += static_cast<int64_t>(*got);
  }
  close(fd);
  if (done != size) {
    return absl::DataLossError(absl::StrCat(what, " '", path, "': short read (", done, " of ", size,
                                            " bytes; it shrank while read)"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain
