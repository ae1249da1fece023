// Writing a small file so that a reader sees either nothing or all of it: the text goes to a
// temporary file beside it, is flushed to disk, and is renamed over the path.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain {

// Errors name the path and the reason; the temporary file is removed on failure.
inline absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(what, " '", path, "': ", reason));
  };
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("cannot write");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return fail("writing");
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    close(fd);
    return fail("writing");
  }
  if (close(fd) != 0) return fail("writing");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename into");
  return absl::OkStatus();
}

}  // namespace pipetrain
