#include "worker/data_roots.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/regular_file.h"

namespace pipetrain::worker {

absl::Status CheckUnderDataRoots(const std::string& field, const std::string& path,
                                 const std::vector<std::string>& roots) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(resolved, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": ", path, " is not a regular file (this worker reads only files)"));
  }
  if (IsUnderRoots(resolved, ResolvedRoots(roots))) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", path, " is outside the directories this worker reads jobs' files from (",
      roots.empty() ? "none: it was started without --data-root" : absl::StrJoin(roots, ", "),
      ")"));
}

std::vector<std::string> WritableRoots(const std::vector<std::string>& data_roots) {
  std::vector<std::string> roots = data_roots;
  std::error_code ec;
  roots.push_back((std::filesystem::current_path(ec) / "checkpoints").string());
  return roots;
}

absl::Status CheckDirectoryUnderRoots(const std::string& field, const std::string& dir,
                                      const std::vector<std::string>& roots) {
  if (dir.empty()) return absl::OkStatus();
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::absolute(dir, ec).lexically_normal();
  std::filesystem::path existing = target;
  while (!existing.empty() && !std::filesystem::exists(existing, ec) &&
         existing != existing.root_path()) {
    existing = existing.parent_path();
  }
  char resolved[PATH_MAX];
  const std::vector<std::string> resolved_roots = ResolvedRoots(roots);
  // Below its nearest existing ancestor nothing exists, so nothing can be a link: the
  // directory is inside if that ancestor (links resolved) is, or if the ancestor leads to a
  // root not made yet (checkpoints/) and the directory, as written, lies under that root.
  bool inside = false;
  if (realpath(existing.c_str(), resolved) != nullptr) {
    const std::string ancestor = resolved;
    const std::filesystem::path rest = target.lexically_relative(existing);
    const std::string lexical = (std::filesystem::path(ancestor) / rest).lexically_normal();
    inside = IsUnderRoots(ancestor, resolved_roots) ||
             (rest.native().rfind("..", 0) != 0 && IsUnderRoots(lexical, resolved_roots));
  }
  if (inside) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(field, ": ", dir,
                   " is outside the directories this worker lets jobs write to and resume "
                   "from (",
                   absl::StrJoin(roots, ", "), ")"));
}

}  // namespace pipetrain::worker
