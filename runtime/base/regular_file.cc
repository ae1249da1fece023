#include "runtime/base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstring>
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

template <typename Bytes>
absl::Status ReadInto(const std::string& path, int64_t limit, absl::string_view what,
                      Bytes* out) {
  // O_NONBLOCK: opening a FIFO with no writer, or a device, returns at once.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", what, " '", path, "': ", std::strerror(errno)));
  }
  if (!Roots().empty() && !IsUnderRoots(OpenedPath(fd), Roots())) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat(
        what, " '", path, "' is outside the directories this process reads jobs' files from (",
        absl::StrJoin(Roots(), ", "), ")"));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  if (st.st_size > limit) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        what, " '", path, "' is ", ByteSize(st.st_size), ", over the bound of ", ByteSize(limit),
        " for one file"));
  }
  Bytes& bytes = *out;
  try {
    bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", ByteSize(st.st_size), " to read ", what, " '", path, "'"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = read(fd, reinterpret_cast<char*>(bytes.data()) + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::NotFoundError(
          absl::StrCat("cannot read ", what, " '", path, "': ", std::strerror(error)));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (done != bytes.size()) {
    return absl::DataLossError(absl::StrCat(what, " '", path, "': short read (", done, " of ",
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

}  // namespace pipetrain
