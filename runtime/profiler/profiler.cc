#include "runtime/profiler/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/hash.h"
#include "runtime/base/threads.h"
#include "runtime/job/plan.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/model/model_zoo.h"
#include "runtime/planner/profile_json.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/gloo/gloo_transport.h"
#include "runtime/weights/optimizer.h"

namespace pipetrain::profiler {
namespace {

// Bumped when what is measured or how changes: older cache files are then ignored.
constexpr int kProfileFormat = 1;

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t Bytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

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

// What a profile of one micro-batch size depends on, as text: the cache key.
std::string CacheKey(const job::JobPlan& plan, const job::JobConfig& config, int b, int threads) {
  const model::ModelConfig& m = plan.model_config;
  nlohmann::json key = {
      {"format", kProfileFormat}, {"build", BuildIdentity()}, {"device", "cpu"},
      {"threads", threads},
      {"micro_batch_size", b},    {"dtype", plan.dtype == at::kDouble ? "float64" : "float32"},
      {"optimizer", config.optimizer.name}, {"model", m.name}, {"vocab_size", m.vocab_size},
      {"seq_len", m.seq_len},     {"d_model", m.d_model},      {"n_heads", m.n_heads},
      {"n_layers", m.n_layers},   {"dropout", m.dropout},      {"input_dim", m.input_dim},
      {"image_shape", m.image_shape}, {"hidden", m.hidden},    {"hidden_layers", m.hidden_layers},
      {"num_classes", m.num_classes}, {"torchscript", m.torchscript_path},
      {"layers", plan.layer_names()}};
  return key.dump();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

// A cached entry is {"key": ..., "value": ...}; one whose key differs is ignored.
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

// One layer at one micro-batch size. `input` is the layer's real input; `next` receives its
// output (detached) for the next layer.
absl::StatusOr<planner::LayerProfile> ProfileLayer(const job::JobConfig& config,
                                                   const job::JobPlan& plan, int layer,
                                                   const at::Tensor& input,
                                                   const at::Tensor& targets,
                                                   const ProfileOptions& options,
                                                   at::Tensor& next) {
  absl::StatusOr<model::LayerList> built = model::BuildLayers(plan.model_config, layer, layer + 1);
  if (!built.ok()) return built.status();
  model::Layer& l = *built->front();
  const bool last = layer + 1 == static_cast<int>(plan.layers.size());
  planner::LayerProfile out;
  out.name = l.name();
  std::vector<at::Tensor> params = l.Parameters();
  for (const at::Tensor& p : params) out.parameter_bytes += Bytes(p);

  model::LayerContext ctx;
  ctx.seed = config.seed;
  ctx.global_layer = layer;
  at::Tensor x = input;
  if (at::isFloatingType(x.scalar_type()) && layer > 0) x = x.detach().requires_grad_(true);
  std::vector<double> forward, backward;
  for (int round = 0; round < options.warmup + options.repeats; ++round) {
    ctx.micro_batch = round;
    const int64_t before = memory::TensorBytesInUse();
    const auto t0 = std::chrono::steady_clock::now();
    at::Tensor y = l.Forward(x, ctx);
    at::Tensor loss;
    if (last) {
      loss = at::cross_entropy_loss(y.reshape({-1, y.size(-1)}), targets.reshape({-1}));
    }
    const auto t1 = std::chrono::steady_clock::now();
    const int64_t kept = memory::TensorBytesInUse() - before;
    at::Tensor grad = last ? at::Tensor() : at::randn_like(y) * 1e-3;
    memory::ResetPeakTensorBytes();
    const int64_t before_backward = memory::TensorBytesInUse();
    const auto t2 = std::chrono::steady_clock::now();
    if (last) {
      loss.backward();
    } else {
      y.backward(grad);
    }
    const auto t3 = std::chrono::steady_clock::now();
    if (round < options.warmup) continue;
    forward.push_back(Seconds(t0, t1));
    backward.push_back(Seconds(t2, t3));
    out.output_bytes = Bytes(y);
    out.stash_bytes = std::max<int64_t>(0, kept - out.output_bytes - (last ? Bytes(loss) : 0));
    // The parameters' gradients exist after the first round, so this is what the backward
    // itself allocates.
    out.working_bytes = std::max<int64_t>(0, memory::PeakTensorBytes() - before_backward);
    if (!last) next = y.detach();
  }
  out.forward_s = Median(forward);
  out.backward_s = Median(backward);

  if (!params.empty()) {
    absl::StatusOr<std::unique_ptr<weights::Optimizer>> optimizer =
        weights::MakeOptimizer(config.optimizer);
    if (!optimizer.ok()) return optimizer.status();
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : params) grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
    at::NoGradGuard no_grad;
    const int64_t before = memory::TensorBytesInUse();
    (*optimizer)->Step(params, grads);
    out.optimizer_bytes = std::max<int64_t>(0, memory::TensorBytesInUse() - before);
    std::vector<double> steps;
    for (int round = 0; round < options.repeats; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      (*optimizer)->Step(params, grads);
      steps.push_back(Seconds(t0, std::chrono::steady_clock::now()));
    }
    out.optimizer_s = Median(steps);
  }
  return out;
}

// Fits latency + bytes / bandwidth through (small, t_small) and (large, t_large).
planner::LinkProfile Fit(double small, double t_small, double large, double t_large) {
  planner::LinkProfile link;
  const double slope = std::max((t_large - t_small) / (large - small), 1e-15);
  link.bytes_per_s = 1.0 / slope;
  link.latency_s = std::max(0.0, t_small - small * slope);
  return link;
}

// How much longer the same computation takes on k threads at once, k = 1 .. cores: each
// thread multiplies 256 x 512 by 512 x 512 and applies GELU, 30 times (about the mix of a
// transformer block), one intra-op thread each, as ranks sharing this machine run.
std::vector<double> MeasureSlowdown(int cores) {
  const auto work = [] {
    const at::Tensor x = at::randn({256, 512}), w = at::randn({512, 512});
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 30; ++i) at::gelu(at::mm(x, w)).add_(1.0);
    return Seconds(t0, std::chrono::steady_clock::now());
  };
  const auto together = [&](int k) {
    std::vector<double> times;
    for (int round = 0; round < 3; ++round) {
      std::vector<std::future<double>> runs;
      for (int t = 0; t < k; ++t) runs.push_back(std::async(std::launch::async, work));
      double sum = 0;
      for (auto& r : runs) sum += r.get();
      times.push_back(sum / k);
    }
    return Median(times);
  };
  work();  // warm-up
  const double alone = together(1);
  std::vector<double> slowdown = {1.0};
  for (int k = 2; k <= cores; ++k) slowdown.push_back(std::max(1.0, together(k) / alone));
  return slowdown;
}

absl::StatusOr<std::pair<planner::LinkProfile, planner::LinkProfile>> ProfileGlooLinks() {
  constexpr int kRounds = 20;
  constexpr int64_t kSmall = 256, kLarge = 1 << 20;  // floats: 1 KiB and 4 MiB
  const absl::Duration timeout = absl::Seconds(60);
  const auto pair = [&](bool replicas) {
    std::shared_ptr<rendezvous::KeyValueStore> store = rendezvous::MakeMemoryStore();
    const auto make = [store, replicas, timeout](int rank) {
      transport::GlooTransportOptions o;
      o.stage = replicas ? 0 : rank;
      o.stages = replicas ? 1 : 2;
      o.replica = replicas ? rank : 0;
      o.replicas = replicas ? 2 : 1;
      o.connect_timeout = timeout;
      return transport::MakeGlooTransport(store, o);
    };
    auto other = std::async(std::launch::async, make, 1);
    auto mine = make(0);
    auto theirs = other.get();
    return std::make_pair(std::move(mine), std::move(theirs));
  };
  using transport::MessageKind;
  // Point to point: rank 0 sends an activation, rank 1 answers with a gradient of the same
  // size; one way is half the round trip.
  auto [a, b] = pair(false);
  if (!a.ok()) return a.status();
  if (!b.ok()) return b.status();
  int64_t tag = 0;
  const auto ping_pong = [&](int64_t floats) -> absl::StatusOr<double> {
    const at::Tensor t = at::ones({floats});
    std::vector<double> times;
    for (int r = 0; r < kRounds + 2; ++r, ++tag) {
      const absl::Time deadline = absl::Now() + timeout;
      auto echo = std::async(std::launch::async, [&, j = tag]() -> absl::Status {
        absl::StatusOr<at::Tensor> got = (*b)->Recv(0, MessageKind::kActivation, j, deadline);
        if (!got.ok()) return got.status();
        return (*b)->Send(0, MessageKind::kGradient, j, *got);
      });
      const auto t0 = std::chrono::steady_clock::now();
      if (absl::Status s = (*a)->Send(1, MessageKind::kActivation, tag, t); !s.ok()) return s;
      absl::StatusOr<at::Tensor> back = (*a)->Recv(1, MessageKind::kGradient, tag, deadline);
      const auto t1 = std::chrono::steady_clock::now();
      if (absl::Status s = echo.get(); !s.ok()) return s;
      if (!back.ok()) return back.status();
      if (r >= 2) times.push_back(Seconds(t0, t1) / 2);
    }
    return Median(times);
  };
  absl::StatusOr<double> p2p_small = ping_pong(kSmall);
  if (!p2p_small.ok()) return p2p_small.status();
  absl::StatusOr<double> p2p_large = ping_pong(kLarge);
  if (!p2p_large.ok()) return p2p_large.status();

  auto [r0, r1] = pair(true);
  if (!r0.ok()) return r0.status();
  if (!r1.ok()) return r1.status();
  const auto reduce = [&](int64_t floats) -> absl::StatusOr<double> {
    std::vector<double> times;
    for (int r = 0; r < kRounds + 2; ++r) {
      const absl::Time deadline = absl::Now() + timeout;
      auto peer = std::async(std::launch::async, [&]() {
        std::vector<at::Tensor> v = {at::ones({floats})};
        return (*r1)->AllReduceMean(v, deadline);
      });
      std::vector<at::Tensor> v = {at::ones({floats})};
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = (*r0)->AllReduceMean(v, deadline);
      const auto t1 = std::chrono::steady_clock::now();
      if (absl::Status p = peer.get(); !p.ok()) return p;
      if (!s.ok()) return s;
      if (r >= 2) times.push_back(Seconds(t0, t1));
    }
    return Median(times);
  };
  absl::StatusOr<double> ar_small = reduce(kSmall);
  if (!ar_small.ok()) return ar_small.status();
  absl::StatusOr<double> ar_large = reduce(kLarge);
  if (!ar_large.ok()) return ar_large.status();
  const double small = 4.0 * kSmall, large = 4.0 * kLarge;
  planner::LinkProfile p2p = Fit(small, *p2p_small, large, *p2p_large);
  // A 2-rank ring AllReduce takes 2 latencies + bytes / bandwidth (profile.h).
  planner::LinkProfile allreduce = Fit(small, *ar_small, large, *ar_large);
  allreduce.latency_s /= 2;
  return std::make_pair(p2p, allreduce);
}

}  // namespace

std::string DefaultProfileCacheDir() {
  if (const char* dir = std::getenv("PIPETRAIN_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/pipetrain/profiles");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.cache/pipetrain/profiles");
  }
  return "";
}

absl::StatusOr<planner::ModelProfile> ProfileJob(const job::JobConfig& config,
                                                 const ProfileOptions& options) {
  if (options.threads < 1 || options.repeats < 1 || options.warmup < 0) {
    return absl::InvalidArgumentError("profiling needs threads >= 1, repeats >= 1, warmup >= 0");
  }
  memory::CountTensorMemory();
  SetIntraOpThreads(options.threads);
  std::vector<int> sizes = options.micro_batch_sizes;
  if (sizes.empty()) sizes.push_back(config.micro_batch_size);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };

  planner::ModelProfile profile;
  profile.threads = options.threads;
  for (int b : sizes) {
    const int64_t before_plan = memory::TensorBytesInUse();
    job::JobConfig one = config;
    one.stages = 1;
    one.stage_ranges.clear();
    one.replicas = 1;
    one.micro_batches = 1;
    one.micro_batch_size = b;
    one.recompute = {};
    one.auto_stages = false;  // one stage, whatever the job's layout will be
    if (absl::Status s = job::ValidateJobConfig(one); !s.ok()) return s;
    absl::StatusOr<job::JobPlan> plan = job::MakeJobPlan(one);
    if (!plan.ok()) return plan.status();
    // What the dataset holds (every rank loads it).
    profile.base_bytes =
        std::max<int64_t>(profile.base_bytes, memory::TensorBytesInUse() - before_plan);
    profile.dtype = plan->dtype == at::kDouble ? "float64" : "float32";
    profile.tokens_per_sample = plan->model_config.name == "gpt" ? plan->model_config.seq_len : 1;
    profile.model = absl::StrCat(plan->model_config.name, ", ", plan->layers.size(), " layers, ",
                                 plan->num_parameters(), " parameters");
    const std::string key = CacheKey(*plan, config, b, options.threads);
    if (std::string cached = CachedValue(options.cache_dir, key); !cached.empty()) {
      absl::StatusOr<planner::MicroBatchProfile> size = planner::MicroBatchProfileFromJson(cached);
      if (size.ok() && size->layers.size() == plan->layers.size()) {
        say(absl::StrCat("micro-batch size ", b, ": from the cache"));
        profile.sizes.push_back(*std::move(size));
        continue;
      }
    }
    job::MicroBatchReader reader(*plan, 1);
    at::Tensor x = reader.Inputs(0);
    const at::Tensor targets = reader.Targets(0);

    planner::MicroBatchProfile size;
    size.micro_batch_size = b;
    for (int l = 0; l < static_cast<int>(plan->layers.size()); ++l) {
      at::Tensor next;
      absl::StatusOr<planner::LayerProfile> layer =
          ProfileLayer(one, *plan, l, x, targets, options, next);
      if (!layer.ok()) return layer.status();
      say(absl::StrFormat("b=%d layer %d %s: forward %.2f ms, backward %.2f ms, optimizer %.2f ms, "
                          "stash %.1f MB",
                          b, l, layer->name, layer->forward_s * 1e3, layer->backward_s * 1e3,
                          layer->optimizer_s * 1e3, layer->stash_bytes / 1e6));
      size.layers.push_back(*std::move(layer));
      x = next;
    }
    StoreValue(options.cache_dir, key, planner::MicroBatchProfileToJson(size));
    profile.sizes.push_back(std::move(size));
  }
  profile.receive_buffer_bytes = transport::GlooPostedReceiveBytes();
  profile.inline_buffer_bytes = transport::GlooInlinePayloadBytes();
  if (options.measure_links) {
    const std::string key = nlohmann::json{{"format", kProfileFormat}, {"links", "gloo loopback"},
                                           {"threads", options.threads}}
                                .dump();
    nlohmann::json cached = nlohmann::json::parse(CachedValue(options.cache_dir, key), nullptr, false);
    if (!cached.is_discarded() && cached.is_object() && cached.contains("p2p") &&
        cached.contains("slowdown")) {
      profile.p2p = {cached["p2p"][0].get<double>(), cached["p2p"][1].get<double>()};
      profile.allreduce = {cached["allreduce"][0].get<double>(), cached["allreduce"][1].get<double>()};
      profile.slowdown = cached["slowdown"].get<std::vector<double>>();
      say("links and cores: from the cache");
    } else {
      absl::StatusOr<std::pair<planner::LinkProfile, planner::LinkProfile>> links = ProfileGlooLinks();
      if (!links.ok()) return links.status();
      profile.p2p = links->first;
      profile.allreduce = links->second;
      profile.slowdown = MeasureSlowdown(AvailableCores());
      StoreValue(options.cache_dir, key,
                 nlohmann::json{{"p2p", {profile.p2p.latency_s, profile.p2p.bytes_per_s}},
                                {"allreduce", {profile.allreduce.latency_s, profile.allreduce.bytes_per_s}},
                                {"slowdown", profile.slowdown}}
                     .dump());
    }
    say(absl::StrFormat("links (Gloo, loopback): point to point %.1f us + %.2f GB/s; AllReduce "
                        "of 2 %.1f us + %.2f GB/s; computing on 1..%d cores at once: %s x",
                        profile.p2p.latency_s * 1e6, profile.p2p.bytes_per_s / 1e9,
                        profile.allreduce.latency_s * 1e6, profile.allreduce.bytes_per_s / 1e9,
                        static_cast<int>(profile.slowdown.size()),
                        absl::StrJoin(profile.slowdown, " ", [](std::string* out, double f) {
                          absl::StrAppendFormat(out, "%.2f", f);
                        })));
  }
  return profile;
}

}  // namespace pipetrain::profiler
