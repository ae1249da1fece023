// Where a worker lets a job's files come from and go to (--data-root): a job's data and
// TorchScript files must be regular files under the roots, and its checkpoint and weights
// directories must lie under them or under the worker's own checkpoints/. Links are
// resolved before anything is compared. Pure functions of the file system; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pipetrain::worker {

// Whether `path` (the job field `field`) is a regular file under one of `roots` once every
// symlink is resolved: NotFound if it is not there, PermissionDenied naming the roots if it
// lies outside them or is not a regular file (a FIFO, a device).
absl::Status CheckUnderDataRoots(const std::string& field, const std::string& path,
                                 const std::vector<std::string>& roots);

// The directories a job may write to and resume from (checkpoint.dir, weights_dir,
// resume_from) when the worker has data roots: those roots and the worker's own checkpoints/
// (the coordinator's default checkpoint.dir is checkpoints/JOB-ID, relative to the worker's
// working directory); empty (no confinement) without data roots.
std::vector<std::string> WritableRoots(const std::vector<std::string>& data_roots);

// Whether directory `dir` (the job field `field`; it need not exist yet: its nearest existing
// ancestor is checked, links resolved) lies under one of `roots`; OK when `roots` is empty.
absl::Status CheckDirectoryUnderRoots(const std::string& field, const std::string& dir,
                                      const std::vector<std::string>& roots);

}  // namespace pipetrain::worker
