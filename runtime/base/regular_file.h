// Reading a file a job names (a data file, a checkpoint's manifest, `latest` or layer, a
// TorchScript model): opened once, without blocking (a FIFO or a device named by a job never
// holds its reader), then checked on the descriptor that is read: a regular file of at most
// `limit` bytes. A file that is not one, or is larger, is an error naming it and the bound;
// so is memory that cannot be had for it. Never throws.
//
// Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// The whole of `path`, at most `limit` bytes. `what` names the file in errors ("byte file",
// "checkpoint layer"). NotFound if it cannot be opened; PermissionDenied if what was opened
// lies outside the process's read roots (below; nothing about it is told); FailedPrecondition
// if it is not a regular file or is over `limit`; ResourceExhausted if its bytes cannot be
// allocated.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t limit,
                                            absl::string_view what);

// The same into `bytes` (replaced).
absl::Status ReadRegularFile(const std::string& path, int64_t limit, absl::string_view what,
                             std::vector<uint8_t>* bytes);

// Opens `path` as ReadRegularFile does and checks that it is exactly `size` bytes before a
// byte is read (DataLoss "... is N bytes where M are expected"), then hands its bytes to
// `consume` in order, in pieces of at most 1 MiB: a file is checked (hashed, say) without
// being held whole. Errors as ReadRegularFile's; DataLoss if it shrinks while read.
absl::Status StreamRegularFile(const std::string& path, int64_t size, absl::string_view what,
                               const std::function<void(absl::string_view piece)>& consume);

// Confines every ReadRegularFile and StreamRegularFile of this process to files under
// `roots` (directories; symlinks in them resolved now), checked on the file as opened (its
// /proc/self/fd link), so that a path whose links change between a check and the read
// cannot lead outside. Empty: no confinement (the default). Call once at start, before any
// read (a worker daemon: its --data-root directories and its own checkpoints/).
void SetReadRoots(const std::vector<std::string>& roots);
// The roots set (resolved), in order; empty when reads are not confined.
std::vector<std::string> ReadRoots();
// `roots` with every link resolved (realpath); one that does not exist (yet) is kept as
// written.
std::vector<std::string> ResolvedRoots(const std::vector<std::string>& roots);
// Whether `resolved` (an absolute path without links) lies under one of `resolved_roots`.
bool IsUnderRoots(const std::string& resolved, const std::vector<std::string>& resolved_roots);

}  // namespace pipetrain
