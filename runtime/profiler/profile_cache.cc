// The profiler's cache of measurements: keys, file names and entries. See profile_cache.h.
#include "runtime/profiler/profile_cache.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/hash.h"
#include "runtime/planner/profile_json.h"

namespace pipetrain::profiler {
namespace {

std::string Hex(uint64_t x) { return absl::StrFormat("%016x", x); }

uint64_t HashText(const std::string& text) {
  uint64_t h = 0x6A09E667F3BCC908ULL;
  for (unsigned char c : text) h = Mix64(h ^ c);
  return h;
}

// The build that measures: the size and modification time of this executable, so that a new
// build (other kernels) measures again; and the kernel choice of the environment.
std::string BuildIdentity() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "unknown";
  const auto size = std::filesystem::file_size(self, ec);
  const auto time = std::filesystem::last_write_time(self, ec);
  const char* gemm = std::getenv("PIPETRAIN_GEMM");
  return absl::StrCat(size, "@", time.time_since_epoch().count(), gemm ? " gemm=" : "",
                      gemm ? gemm : "");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

}  // namespace

bool MachineProfileFromOrNot(const std::string& cached, planner::ModelProfile& profile) {
  if (cached.empty()) return false;
  planner::ModelProfile read = profile;
  if (!planner::MachineProfileFromJson(cached, &read).ok()) return false;
  profile = std::move(read);
  return true;
}

std::string CacheKey(const job::JobPlan& plan, const job::JobSpec& config, int b, int threads,
                     const std::vector<std::pair<int, int>>& windows) {
  const model::ModelConfig& m = plan.model_config;
  nlohmann::json key = {{"format", kProfileFormat},
                        {"build", BuildIdentity()},
                        {"device", "cpu"},
                        {"threads", threads},
                        {"micro_batch_size", b},
                        {"dtype", job::PrecisionName(job::PrecisionOf(config))},
                        {"optimizer", config.optimizer().name()},
                        {"model", m.name},
                        {"vocab_size", m.vocab_size},
                        {"seq_len", m.seq_len},
                        {"d_model", m.d_model},
                        {"n_heads", m.n_heads},
                        {"n_layers", m.n_layers},
                        {"dropout", m.dropout},
                        {"input_dim", m.input_dim},
                        {"image_shape", m.image_shape},
                        {"hidden", m.hidden},
                        {"hidden_layers", m.hidden_layers},
                        {"num_classes", m.num_classes},
                        {"torchscript", m.torchscript_path},
                        {"layers", plan.layer_names()},
                        {"windows", windows}};
  return key.dump();
}

std::string CachedValue(const std::string& dir, const std::string& key) {
  if (dir.empty()) return "";
  const std::string text = ReadFile(absl::StrCat(dir, "/", Hex(HashText(key)), ".json"));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("key", "") != key || !j.contains("value")) {
    return "";
  }
  return j["value"].dump();
}

void StoreValue(const std::string& dir, const std::string& key, const std::string& value_json) {
  if (dir.empty()) return;
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  nlohmann::json j = {{"key", key}, {"value", nlohmann::json::parse(value_json)}};
  // A cache that cannot be written costs a measurement next time, nothing more.
  (void)WriteFileAtomically(absl::StrCat(dir, "/", Hex(HashText(key)), ".json"), j.dump(1));
}

}  // namespace pipetrain::profiler
