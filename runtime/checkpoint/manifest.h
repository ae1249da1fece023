// A checkpoint's manifest: what a checkpoint directory holds and how to check it
// (docs/checkpoints.md). Written last, so a directory with a manifest is complete.
//
// A checkpoint is keyed by global layer, not by rank: one file per layer with its
// parameters, buffers and optimizer state, so it loads into any number of stages and
// replicas. The manifest records the step (the next mini-batch to run; the weights are
// W(step)), the job that wrote it (its JobSpec JSON: model, hyper-parameters, schedule,
// data), the layout it was written from, the data position and, per file, its layers, size
// and SHA-256. No LibTorch here (the fuzzer reads manifests without it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/pipeline_layout.h"

namespace pipetrain::checkpoint {

inline constexpr int kFormatVersion = 1;
// Bounds on what a manifest may claim (a hostile or corrupt one is refused, not obeyed).
inline constexpr int64_t kMaxManifestBytes = int64_t{16} << 20;
inline constexpr int kMaxLayers = 1 << 16;
// The largest layer file (a layer's weights, buffers and optimizer state): each is read whole
// into memory, so a manifest that declares more is refused before anything is read.
inline constexpr int64_t kMaxFileBytes = int64_t{64} << 30;

struct LayerFile {
  std::string name;  // LayerFileName(layer), in the checkpoint directory
  int layer = 0;     // global layer index
  int64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex digits
};

struct Manifest {
  int format = kFormatVersion;
  int64_t step = 0;  // the weights are W(step); a resumed job runs from step
  int num_layers = 0;
  std::string job;               // the writing job's JobSpec as JSON (JobToJson)
  model::PipelineLayout layout;  // the layout it was written from
  int64_t samples_seen = 0;      // data position: step x global batch size
  int64_t global_batch_size = 0;
  int64_t created_unix_ms = 0;
  std::vector<LayerFile> files;  // one per layer, in layer order
};

std::string ManifestToJson(const Manifest& manifest);
// Strict: every field present and in range, files covering layers 0 .. num_layers-1 once
// each, in order, named LayerFileName(layer), with well-formed digests; DataLoss naming what
// is wrong.
absl::StatusOr<Manifest> ParseManifest(std::string_view text);

// "layer-00007.pt"
std::string LayerFileName(int layer);

}  // namespace pipetrain::checkpoint
