// libFuzzer target: the checkpoint manifest reader (runtime/checkpoint/manifest.h) on any
// bytes a checkpoint directory could hold. Properties: never a crash; an accepted manifest
// covers every layer once, in order, under its own file name, and writes back to text that
// reads as the same manifest.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/checkpoint/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain::checkpoint;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Manifest> m = ParseManifest(text);
  if (!m.ok()) return 0;
  if (static_cast<int>(m->files.size()) != m->num_layers) std::abort();
  for (int l = 0; l < m->num_layers; ++l) {
    if (m->files[l].layer != l || m->files[l].name != LayerFileName(l)) std::abort();
  }
  const std::string again = ManifestToJson(*m);
  absl::StatusOr<Manifest> back = ParseManifest(again);
  if (!back.ok() || ManifestToJson(*back) != again) std::abort();
  return 0;
}
