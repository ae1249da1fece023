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
// resume_from), and every file a job makes the worker read lies under: the data roots and
// the worker's own checkpoints/ (the coordinator's default checkpoint.dir is
// checkpoints/JOB-ID, relative to the worker's working directory). A worker without data
// roots confines its jobs to checkpoints/ alone: it was once unconfined, and a job's
// resume_from could read any file of the machine (the size of /etc/shadow, say).
std::vector<std::string> WritableRoots(const std::vector<std::string>& data_roots);

// Whether directory `dir` (the job field `field`; it need not exist yet: its nearest existing
// ancestor is checked, links resolved) lies under one of `roots` (WritableRoots); OK for an
// empty `dir` (the field not set).
absl::Status CheckDirectoryUnderRoots(const std::string& field, const std::string& dir,
                                      const std::vector<std::string>& roots);

}  // namespace pipetrain::worker
