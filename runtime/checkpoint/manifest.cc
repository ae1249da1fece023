#include "runtime/checkpoint/manifest.h"

#include <cctype>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace pipetrain::checkpoint {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint manifest: ", what));
}

// obj[key] as an integer in [lo, hi].
absl::StatusOr<int64_t> Int(const json& obj, const char* key, int64_t lo, int64_t hi) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) {
    return Bad(absl::StrCat("'", key, "' must be an integer"));
  }
  const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}
                        ? hi + 1
                        : it->get<int64_t>();
  if (v < lo || v > hi) {
    return Bad(absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "]: got ", v));
  }
  return v;
}

bool HexDigest(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string LayerFileName(int layer) {
  char name[32];
  std::snprintf(name, sizeof(name), "layer-%05d.pt", layer);
  return name;
}

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["format"] = m.format;
  j["step"] = m.step;
  j["num_layers"] = m.num_layers;
  j["job"] = json::parse(m.job.empty() ? "{}" : m.job, nullptr, /*allow_exceptions=*/false);
  json stage_layers = json::array();
  for (const auto& [begin, end] : m.layout.stage_layers) stage_layers.push_back({begin, end});
  j["layout"] = {{"stages", m.layout.stages},
                 {"replicas", m.layout.replicas},
                 {"micro_batches", m.layout.micro_batches},
                 {"micro_batch_size", m.layout.micro_batch_size},
                 {"stage_layers", stage_layers}};
  j["data"] = {{"samples_seen", m.samples_seen}, {"global_batch_size", m.global_batch_size}};
  j["created_unix_ms"] = m.created_unix_ms;
  json files = json::array();
  for (const LayerFile& f : m.files) {
    files.push_back(
        {{"name", f.name}, {"layer", f.layer}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  }
  j["files"] = files;
  return j.dump(2) + "\n";
}

absl::StatusOr<Manifest> ParseManifest(std::string_view text) {
  if (static_cast<int64_t>(text.size()) > kMaxManifestBytes) {
    return Bad(absl::StrCat("larger than ", kMaxManifestBytes, " bytes"));
  }
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad("not a JSON object");
  Manifest m;
  auto format = Int(j, "format", 0, INT32_MAX);
  if (!format.ok()) return format.status();
  if (*format != kFormatVersion) {
    return Bad(absl::StrCat("format ", *format, " is not the one this build reads (",
                            kFormatVersion, ")"));
  }
  auto step = Int(j, "step", 1, INT32_MAX);
  if (!step.ok()) return step.status();
  m.step = *step;
  auto num_layers = Int(j, "num_layers", 1, kMaxLayers);
  if (!num_layers.ok()) return num_layers.status();
  m.num_layers = static_cast<int>(*num_layers);
  auto created = Int(j, "created_unix_ms", 0, INT64_MAX);
  if (!created.ok()) return created.status();
  m.created_unix_ms = *created;
  if (!j.contains("job") || !j["job"].is_object()) return Bad("'job' must be an object");
  m.job = j["job"].dump();

  if (!j.contains("layout") || !j["layout"].is_object()) return Bad("'layout' must be an object");
  const json& layout = j["layout"];
  for (auto [key, field] :
       {std::pair{"stages", &m.layout.stages}, std::pair{"replicas", &m.layout.replicas},
        std::pair{"micro_batches", &m.layout.micro_batches},
        std::pair{"micro_batch_size", &m.layout.micro_batch_size}}) {
    auto v = Int(layout, key, 1, kMaxLayers * int64_t{1024});
    if (!v.ok()) return v.status();
    *field = static_cast<int>(*v);
  }
  if (m.layout.stages > m.num_layers) return Bad("more stages than layers");
  if (!layout.contains("stage_layers") || !layout["stage_layers"].is_array() ||
      static_cast<int>(layout["stage_layers"].size()) != m.layout.stages) {
    return Bad("'layout.stage_layers' must list [begin, end) of every stage");
  }
  int expect = 0;
  for (const json& r : layout["stage_layers"]) {
    if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer() ||
        r[0].get<int64_t>() != expect || r[1].get<int64_t>() <= expect ||
        r[1].get<int64_t>() > m.num_layers) {
      return Bad("'layout.stage_layers' must be contiguous, non-empty ranges from layer 0");
    }
    m.layout.stage_layers.emplace_back(expect, static_cast<int>(r[1].get<int64_t>()));
    expect = static_cast<int>(r[1].get<int64_t>());
  }
  if (expect != m.num_layers) return Bad("'layout.stage_layers' must end at num_layers");

  if (!j.contains("data") || !j["data"].is_object()) return Bad("'data' must be an object");
  auto batch = Int(j["data"], "global_batch_size", 1, INT32_MAX);
  if (!batch.ok()) return batch.status();
  m.global_batch_size = *batch;
  auto seen = Int(j["data"], "samples_seen", 0, INT64_MAX);
  if (!seen.ok()) return seen.status();
  m.samples_seen = *seen;
  if (m.samples_seen / m.global_batch_size != m.step || m.samples_seen % m.global_batch_size) {
    return Bad("'data.samples_seen' must be step x global_batch_size");
  }

  if (!j.contains("files") || !j["files"].is_array() ||
      static_cast<int64_t>(j["files"].size()) != m.num_layers) {
    return Bad("'files' must list one file per layer");
  }
  for (const json& f : j["files"]) {
    if (!f.is_object()) return Bad("every file must be an object");
    LayerFile file;
    auto layer = Int(f, "layer", 0, m.num_layers - 1);
    if (!layer.ok()) return layer.status();
    file.layer = static_cast<int>(*layer);
    if (file.layer != static_cast<int>(m.files.size())) {
      return Bad(absl::StrCat("a file is for layer ", file.layer, " where layer ", m.files.size(),
                              " comes next"));
    }
    if (!f.contains("name") || !f["name"].is_string() ||
        (file.name = f["name"].get<std::string>()) != LayerFileName(file.layer)) {
      return Bad(absl::StrCat("the file of layer ", file.layer, " must be named ",
                              LayerFileName(file.layer)));
    }
    auto bytes = Int(f, "bytes", 1, kMaxFileBytes);
    if (!bytes.ok()) return bytes.status();
    file.bytes = *bytes;
    if (!f.contains("sha256") || !f["sha256"].is_string() ||
        !HexDigest(file.sha256 = f["sha256"].get<std::string>())) {
      return Bad(absl::StrCat("file ", file.name, ": 'sha256' must be 64 lowercase hex digits"));
    }
    m.files.push_back(std::move(file));
  }
  return m;
}

}  // namespace pipetrain::checkpoint
