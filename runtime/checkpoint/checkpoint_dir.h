// Checkpoint directories: written atomically, kept K at a time, found again after a crash.
//
//   ROOT/step-N.tmp/   files being written (each fsynced), the manifest last; writers that
//                      deliver through a store name theirs step-N.TAG.tmp (Join), so that
//                      two sets of writers never share one (job_checkpoints.h)
//   ROOT/step-N/       a complete checkpoint: renamed from step-N.tmp, ROOT fsynced
//   ROOT/latest        "step-N\n": the newest complete one, replaced atomically (tmp + rename,
//                      ROOT fsynced) after the rename
// A crash at any point leaves `latest` naming a complete checkpoint (or absent before the
// first), every complete one intact, and at most a step-N.tmp that the next writer removes.
// A failed write (a full disk, an I/O error) removes its step-N.tmp and reports the error;
// `latest` and the earlier checkpoints stay as they were. No LibTorch here.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/manifest.h"

namespace pipetrain::checkpoint {

// "step-00000120"
std::string StepDirName(int64_t step);

// One checkpoint being written. WriteLayer is thread-safe (the stages of one process write
// their layers concurrently); Commit and Abort are called once, after every WriteLayer.
class CheckpointWriter {
 public:
  // Creates ROOT (if missing) and ROOT/step-N.tmp (an older one is removed first).
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Begin(const std::string& root,
                                                                 int64_t step);
  // For writers in several processes (each writes its own layers, one commits): creates ROOT
  // and ROOT/step-N.TAG.tmp (ROOT/step-N.tmp for an empty `tag`) if missing and removes
  // nothing (the others may be writing there). A file left by an earlier attempt at the same
  // step and tag is rewritten by its layer's writer; only the files the manifest names are
  // ever read. `tag`: letters, digits and '-' (InvalidArgument otherwise).
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Join(const std::string& root,
                                                                int64_t step,
                                                                const std::string& tag = "");
  ~CheckpointWriter();  // Aborts if neither Commit nor Abort ran

  // Writes LayerFileName(layer) (fsynced); its entry for the manifest.
  absl::StatusOr<LayerFile> WriteLayer(int layer, const std::string& bytes);
  // Writes the manifest (manifest.files must cover every layer, as written), renames the
  // directory, replaces `latest` (unless it names a newer step: a job resumed from an older
  // checkpoint does not hide the newer ones), removes the oldest complete checkpoints beyond
  // `keep` (never this one), the temporary directories of earlier steps (writers that died)
  // and those of this step under another tag (writers fenced out: their commit can no longer
  // come first). Commits under one ROOT are serialized (an flock on ROOT/.commit-lock), so a
  // step committed by two sets of writers is replaced whole, never seen half-renamed.
  // On failure the directory is removed and `latest` unchanged.
  absl::Status Commit(const Manifest& manifest, int keep);
  // Removes the temporary directory.
  void Abort();
  // Neither commits nor removes anything (a writer whose checkpoint another commits).
  void Release() { done_ = true; }

  const std::string& tmp_dir() const { return tmp_; }

 private:
  CheckpointWriter(std::string root, int64_t step, const std::string& tag);
  std::string root_, tmp_, final_;
  int64_t step_;
  bool done_ = false;
  std::mutex mu_;
};

// A checkpoint found and checked: its directory, its manifest, and the newer ones that were
// skipped, each with why (a missing or unreadable manifest, a file of the wrong size or
// checksum).
struct FoundCheckpoint {
  std::string dir;
  Manifest manifest;
  std::vector<std::string> skipped;
};

// `path` a checkpoint directory (step-N: only that one) or a root, or the root's `latest`
// pointer file itself: the one `latest` names, else (or if it fails its checks) the newest
// complete step-N that passes them. Every file
// is read and its size and SHA-256 compared. NotFound if none passes (listing why each
// failed).
absl::StatusOr<FoundCheckpoint> FindCheckpoint(const std::string& path);

// The checkpoint in `step_dir` (a step-N directory) by its manifest alone, its files not
// read: for a process that reads only some layers, each checked by ReadLayer, after another
// has checked the whole checkpoint with FindCheckpoint.
absl::StatusOr<FoundCheckpoint> OpenCheckpoint(const std::string& step_dir);

// The bytes of one layer's file of a found checkpoint, checked against the manifest again
// (the file may have changed since FindCheckpoint): its size before a byte is read, its
// SHA-256 as it is read (one pass). DataLoss naming the file for either.
absl::StatusOr<std::string> ReadLayer(const FoundCheckpoint& found, int layer);

// The same checks without keeping the bytes: the file is streamed through its hash, so
// verifying a layer holds 1 MiB of it at a time, whatever its size (FindCheckpoint checks
// every layer this way).
absl::Status VerifyLayer(const FoundCheckpoint& found, int layer);

}  // namespace pipetrain::checkpoint
