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

#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/hash.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/subprocess.h"
#include "runtime/base/threads.h"
#include "runtime/job/plan.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/model/mixed_precision.h"
#include "runtime/model/model_zoo.h"
#include "runtime/planner/profile_json.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/gloo/gloo_transport.h"
#include "runtime/weights/optimizer.h"
#include "runtime/weights/weight_store.h"


namespace pipetrain::profiler {
namespace {

// Bumped when what is measured or how changes: older cache files are then ignored.
constexpr int kProfileFormat = 2;

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

// Reads the machine's part of a profile from the cache's text into `profile`: false (and
// `profile` as it was) when there is none or it does not parse.
bool MachineProfileFromOrNot(const std::string& cached, planner::ModelProfile& profile) {
  if (cached.empty()) return false;
  planner::ModelProfile read = profile;
  if (!planner::MachineProfileFromJson(cached, &read).ok()) return false;
  profile = std::move(read);
  return true;
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
std::string CacheKey(const job::JobPlan& plan, const job::JobConfig& config, int b, int threads,
                     const std::vector<std::pair<int, int>>& windows) {
  const model::ModelConfig& m = plan.model_config;
  nlohmann::json key = {
      {"format", kProfileFormat}, {"build", BuildIdentity()}, {"device", "cpu"},
      {"threads", threads},
      {"micro_batch_size", b},    {"dtype", job::PrecisionName(config.precision)},
      {"optimizer", config.optimizer.name}, {"model", m.name}, {"vocab_size", m.vocab_size},
      {"seq_len", m.seq_len},     {"d_model", m.d_model},      {"n_heads", m.n_heads},
      {"n_layers", m.n_layers},   {"dropout", m.dropout},      {"input_dim", m.input_dim},
      {"image_shape", m.image_shape}, {"hidden", m.hidden},    {"hidden_layers", m.hidden_layers},
      {"num_classes", m.num_classes}, {"torchscript", m.torchscript_path},
      {"layers", plan.layer_names()}, {"windows", windows}};
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

// Layers [begin, end) at one micro-batch size, run as a stage runs them: every round a
// forward through the layers in order (the last layer of the model adds the loss), a
// backward through them in reverse, each layer's from the gradient the next one produced
// (the window's last layer, when the model goes on, from a small random gradient of its
// output's shape), then each layer's update (the finiteness check and the optimizer's
// step), so that every layer meets the caches as it does inside a stage. Each layer's input
// is detached from the previous layer's output, so its forward and backward are timed alone.
// `input` is the real input of layer `begin`; `next` receives the window's output (detached).
absl::StatusOr<std::vector<planner::LayerProfile>> ProfileWindow(
    const job::JobConfig& config, const job::JobPlan& plan, int begin, int end,
    const at::Tensor& input, const at::Tensor& targets, const ProfileOptions& options,
    at::Tensor& next) {
  absl::StatusOr<model::LayerList> built = model::BuildLayers(plan.model_config, begin, end);
  if (!built.ok()) return built.status();
  const int n = end - begin;
  const bool ends_model = end == static_cast<int>(plan.layers.size());
  std::vector<planner::LayerProfile> out(n);
  std::vector<std::vector<at::Tensor>> params(n);
  std::vector<std::unique_ptr<weights::Optimizer>> optimizers(n);
  for (int i = 0; i < n; ++i) {
    model::Layer& l = *(*built)[i];
    out[i].name = l.name();
    params[i] = l.Parameters();
    for (const at::Tensor& p : params[i]) out[i].parameter_bytes += Bytes(p);
    if (params[i].empty()) continue;
    absl::StatusOr<std::unique_ptr<weights::Optimizer>> optimizer =
        weights::MakeOptimizer(config.optimizer);
    if (!optimizer.ok()) return optimizer.status();
    optimizers[i] = *std::move(optimizer);
  }
  std::vector<std::vector<double>> forward(n), backward(n), update(n);
  for (int round = 0; round < options.warmup + options.repeats; ++round) {
    const bool timed = round >= options.warmup;
    std::vector<at::Tensor> inputs(n), outputs(n);
    at::Tensor loss;
    for (int i = 0; i < n; ++i) {
      at::Tensor x = i == 0 ? input : outputs[i - 1];
      if (at::isFloatingType(x.scalar_type()) && begin + i > 0) {
        x = x.detach().requires_grad_(true);
      }
      inputs[i] = x;
      model::LayerContext ctx;
      ctx.seed = config.seed;
      ctx.global_layer = begin + i;
      ctx.micro_batch = round;
      const bool last = ends_model && i + 1 == n;
      const int64_t before = memory::TensorBytesInUse();
      const auto t0 = std::chrono::steady_clock::now();
      {
        // A bfloat16 job's layers compute under autocast, as in its stages.
        model::MixedPrecisionScope mixed(c10::DeviceType::CPU, plan.compute_dtype);
        outputs[i] = (*built)[i]->Forward(x, ctx);
      }
      if (last) {
        loss = at::cross_entropy_loss(outputs[i].reshape({-1, outputs[i].size(-1)}),
                                      targets.reshape({-1}));
      }
      const auto t1 = std::chrono::steady_clock::now();
      const int64_t kept = memory::TensorBytesInUse() - before;
      if (!timed) continue;
      forward[i].push_back(Seconds(t0, t1));
      out[i].output_bytes = Bytes(outputs[i]);
      out[i].stash_bytes =
          std::max<int64_t>(0, kept - out[i].output_bytes - (last ? Bytes(loss) : 0));
    }
    if (!ends_model) next = outputs[n - 1].detach();
    at::Tensor grad = ends_model ? at::Tensor() : at::randn_like(outputs[n - 1]) * 1e-3;
    for (int i = n - 1; i >= 0; --i) {
      memory::ResetPeakTensorBytes();
      const int64_t before_backward = memory::TensorBytesInUse();
      const auto t0 = std::chrono::steady_clock::now();
      if (ends_model && i + 1 == n) {
        loss.backward();
        loss = at::Tensor();
      } else {
        outputs[i].backward(grad);
      }
      const auto t1 = std::chrono::steady_clock::now();
      // The gradients of the parameters exist after the first round, so this is what the
      // backward itself allocates (its input's gradient included).
      const int64_t working = memory::PeakTensorBytes() - before_backward;
      grad = inputs[i].requires_grad() ? inputs[i].grad() : at::Tensor();
      outputs[i] = at::Tensor();  // frees what the forward kept, as the stage does
      if (!timed) continue;
      backward[i].push_back(Seconds(t0, t1));
      out[i].working_bytes = std::max<int64_t>(0, working);
    }
    for (int i = 0; i < n; ++i) {
      if (!optimizers[i]) continue;
      std::vector<at::Tensor> grads;
      for (const at::Tensor& p : params[i]) {
        grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
      }
      at::NoGradGuard no_grad;
      const int64_t before = memory::TensorBytesInUse();
      const auto t0 = std::chrono::steady_clock::now();
      const bool finite = weights::AllFinite(grads);
      optimizers[i]->Step(params[i], grads);
      const auto t1 = std::chrono::steady_clock::now();
      if (round == 0) out[i].optimizer_bytes = std::max<int64_t>(0, memory::TensorBytesInUse() - before);
      if (timed && finite) update[i].push_back(Seconds(t0, t1));
    }
  }
  for (int i = 0; i < n; ++i) {
    out[i].forward_s = Median(forward[i]);
    out[i].backward_s = Median(backward[i]);
    out[i].optimizer_s = Median(update[i]);
  }
  return out;
}

// Consecutive runs of layers to profile together: as many as keep their parameters, their
// gradients and an AdamW state (4 x the parameters) within `budget` bytes; at least one.
std::vector<std::pair<int, int>> ProfileWindows(const job::JobPlan& plan, int64_t budget) {
  std::vector<std::pair<int, int>> windows;
  const int layers = static_cast<int>(plan.layers.size());
  const int64_t element = plan.dtype == at::kDouble ? 8 : 4;
  int begin = 0;
  int64_t bytes = 0;
  for (int l = 0; l < layers; ++l) {
    const int64_t layer_bytes = 4 * element * plan.layers[l].num_parameters;
    if (l > begin && bytes + layer_bytes > budget) {
      windows.emplace_back(begin, l);
      begin = l;
      bytes = 0;
    }
    bytes += layer_bytes;
  }
  windows.emplace_back(begin, layers);
  return windows;
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

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// The link measurements, run by two sides in step: side 0 (the profiler) leads and keeps the
// results, side 1 (a process of its own, as ranks run, or a thread of this one) follows the
// same sequence and hands its CPU times to side 0 through the point-to-point store.
constexpr int kPingPongRounds = 20;
constexpr int64_t kSmallFloats = 256, kLargeFloats = 1 << 20;  // 1 KiB and 4 MiB
constexpr int kMessageRounds = 60;
// Message sizes whose CPU is measured: the largest carried inline (128 KiB) and one just
// above it (a second message) among them.
constexpr int64_t kMessageBytes[] = {256, 16 << 10, 128 << 10, 160 << 10, 1 << 20, 8 << 20};
const absl::Duration kLinkTimeout = absl::Seconds(60);

struct LinkSideResult {  // side 0's
  double p2p_small = 0, p2p_large = 0, ar_small = 0, ar_large = 0;
  double ar_cpu_small = 0, ar_cpu_large = 0;  // per rank
  std::vector<planner::MessageCost> messages;
};

absl::StatusOr<std::unique_ptr<transport::Transport>> LinkTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, int side, bool replicas) {
  transport::GlooTransportOptions o;
  o.stage = replicas ? 0 : side;
  o.stages = replicas ? 1 : 2;
  o.replica = replicas ? side : 0;
  o.replicas = replicas ? 2 : 1;
  o.connect_timeout = kLinkTimeout;
  return transport::MakeGlooTransport(std::move(store), o);
}

// One side of the sequence. `same_process`: both sides are threads of this process, so a
// process's CPU time counts both.
absl::Status RunLinkSide(int side, std::shared_ptr<rendezvous::KeyValueStore> p2p_store,
                         std::shared_ptr<rendezvous::KeyValueStore> replica_store,
                         bool same_process, LinkSideResult* out) {
  using transport::MessageKind;
  const int peer = 1 - side;
  auto p2p = LinkTransport(p2p_store, side, false);
  if (!p2p.ok()) return p2p.status();
  transport::Transport& link = **p2p;
  int64_t tag = 0;
  const auto deadline = [] { return absl::Now() + kLinkTimeout; };

  // Point to point: side 0 sends an activation, side 1 answers with a gradient of the same
  // size; one way is half the round trip (the median).
  const auto ping_pong = [&](int64_t floats) -> absl::StatusOr<double> {
    const at::Tensor t = at::ones({floats});
    std::vector<double> times;
    for (int r = 0; r < kPingPongRounds + 2; ++r, ++tag) {
      if (side == 1) {
        absl::StatusOr<at::Tensor> got = link.Recv(0, MessageKind::kActivation, tag, deadline());
        if (!got.ok()) return got.status();
        PT_RETURN_IF_ERROR(link.Send(0, MessageKind::kGradient, tag, *got));
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      PT_RETURN_IF_ERROR(link.Send(1, MessageKind::kActivation, tag, t));
      absl::StatusOr<at::Tensor> back = link.Recv(1, MessageKind::kGradient, tag, deadline());
      if (!back.ok()) return back.status();
      if (r >= 2) times.push_back(Seconds(t0, std::chrono::steady_clock::now()) / 2);
    }
    return Median(times);
  };
  absl::StatusOr<double> p2p_small = ping_pong(kSmallFloats);
  if (!p2p_small.ok()) return p2p_small.status();
  absl::StatusOr<double> p2p_large = ping_pong(kLargeFloats);
  if (!p2p_large.ok()) return p2p_large.status();

  // Messages between busy ranks: each side repeats {compute for about half a millisecond;
  // send message r to the other; receive the other's message r}, as neighbouring stages do.
  // Per message: the sending thread's CPU in Send, the receiving thread's in Recv (its
  // waits cost none), and every other thread's of the process (the transport's event loop
  // and delivery thread, woken for each message): the medians of the sides' per-round means.
  const at::Tensor x = at::randn({128, 256}), weight = at::randn({256, 256});
  const auto compute = [&](int reps) {
    for (int i = 0; i < reps; ++i) at::mm(x, weight);
  };
  compute(4);
  const auto c0 = std::chrono::steady_clock::now();
  compute(20);
  const int reps = std::max(
      1, static_cast<int>(5e-4 / std::max(Seconds(c0, std::chrono::steady_clock::now()) / 20, 1e-7)));
  for (size_t i = 0; i < std::size(kMessageBytes); ++i) {
    const int64_t bytes = kMessageBytes[i];
    const at::Tensor t = at::ones({bytes / 4});
    // Per round: this side's CPU in Send and in Recv, the CPU of its process's other threads,
    // and how long its Recv lasted.
    std::vector<double> send, recv, others, waits;
    for (int r = 0; r < kMessageRounds + 2; ++r, ++tag) {
      compute(reps);
      const double process0 = ProcessCpuSeconds(), s0 = ThreadCpuSeconds();
      PT_RETURN_IF_ERROR(link.Send(peer, MessageKind::kActivation, tag, t));
      const double s1 = ThreadCpuSeconds();
      const auto sent = std::chrono::steady_clock::now();
      absl::StatusOr<at::Tensor> got = link.Recv(peer, MessageKind::kActivation, tag, deadline());
      if (!got.ok()) return got.status();
      const double s2 = ThreadCpuSeconds();
      if (r < 2) continue;
      waits.push_back(Seconds(sent, std::chrono::steady_clock::now()));
      send.push_back(s1 - s0);
      recv.push_back(s2 - s1);
      // Until the next round's exchange begins, the other threads' work for this one goes on.
      others.push_back(ProcessCpuSeconds() - process0 - (s2 - s0));
    }
    // The other threads' work outlasts the round it belongs to: their CPU over a whole round,
    // from one exchange to the next, is what one exchange costs them.
    std::vector<double> per_round;
    for (size_t k = 0; k + 1 < others.size(); ++k) per_round.push_back(others[k]);
    const std::string key = absl::StrCat("messages/", i);
    const std::string mine = absl::StrCat(Median(send), " ", Median(recv), " ",
                                          Median(per_round), " ", Median(waits));
    if (side == 1) {
      PT_RETURN_IF_ERROR(p2p_store->Set(key, mine));
      continue;
    }
    absl::StatusOr<std::string> theirs = p2p_store->Get(key, kLinkTimeout);
    if (!theirs.ok()) return theirs.status();
    double peer_send = 0, peer_recv = 0, peer_others = 0, peer_wait = 0;
    if (std::sscanf(theirs->c_str(), "%lf %lf %lf %lf", &peer_send, &peer_recv, &peer_others,
                    &peer_wait) != 4) {
      return absl::InternalError("the link peer's message report does not parse");
    }
    // Both sides send at about the same time, so a Recv lasts about the message's way. In
    // one process, each side's other threads are the other side's and the transports' both.
    const double background =
        same_process ? std::max(0.0, Median(per_round) - peer_send - peer_recv) / 2
                     : (Median(per_round) + peer_others) / 2;
    out->messages.push_back({bytes, (Median(send) + peer_send) / 2,
                             (Median(recv) + peer_recv) / 2, std::max(0.0, background),
                             (Median(waits) + peer_wait) / 2});
  }

  // AllReduce between the two: elapsed and the CPU of one rank (its process's; both ranks'
  // halved when they share this process), the medians over the rounds.
  auto reduce_link = LinkTransport(replica_store, side, true);
  if (!reduce_link.ok()) return reduce_link.status();
  const auto reduce = [&](int64_t floats, int which, double* cpu) -> absl::StatusOr<double> {
    std::vector<double> times, cpu_times;
    for (int r = 0; r < kPingPongRounds + 2; ++r) {
      std::vector<at::Tensor> v = {at::ones({floats})};
      const double process0 = ProcessCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      PT_RETURN_IF_ERROR((*reduce_link)->AllReduceMean(v, deadline()));
      if (r < 2) continue;
      times.push_back(Seconds(t0, std::chrono::steady_clock::now()));
      cpu_times.push_back(ProcessCpuSeconds() - process0);
    }
    const double mine = Median(cpu_times);
    const std::string key = absl::StrCat("allreduce/", which);
    if (side == 1) {
      PT_RETURN_IF_ERROR(p2p_store->Set(key, absl::StrCat(mine)));
    } else {
      absl::StatusOr<std::string> theirs = p2p_store->Get(key, kLinkTimeout);
      if (!theirs.ok()) return theirs.status();
      double peer_cpu = 0;
      if (!absl::SimpleAtod(*theirs, &peer_cpu)) {
        return absl::InternalError("the link peer's AllReduce report does not parse");
      }
      *cpu = same_process ? mine / 2 : (mine + peer_cpu) / 2;
    }
    return Median(times);
  };
  double cpu_small = 0, cpu_large = 0;
  absl::StatusOr<double> ar_small = reduce(kSmallFloats, 0, &cpu_small);
  if (!ar_small.ok()) return ar_small.status();
  absl::StatusOr<double> ar_large = reduce(kLargeFloats, 1, &cpu_large);
  if (!ar_large.ok()) return ar_large.status();
  if (side == 0) {
    out->p2p_small = *p2p_small;
    out->p2p_large = *p2p_large;
    out->ar_small = *ar_small;
    out->ar_large = *ar_large;
    out->ar_cpu_small = cpu_small;
    out->ar_cpu_large = cpu_large;
  }
  // Neither side leaves (closing its connections) before the other is done.
  PT_RETURN_IF_ERROR(p2p_store->Set(absl::StrCat("done/", side), "1"));
  return p2p_store->Get(absl::StrCat("done/", peer), kLinkTimeout).status();
}

struct GlooLinks {
  planner::LinkProfile p2p, allreduce, allreduce_cpu;
  std::vector<planner::MessageCost> messages;
};

// Side 1 in a process of its own when `peer_command` is given (it is run with the two
// stores' ports appended), else in a thread of this one.
absl::StatusOr<GlooLinks> ProfileGlooLinks(const std::vector<std::string>& peer_command) {
  LinkSideResult result;
  if (peer_command.empty()) {
    std::shared_ptr<rendezvous::KeyValueStore> p2p_store = rendezvous::MakeMemoryStore();
    std::shared_ptr<rendezvous::KeyValueStore> replica_store = rendezvous::MakeMemoryStore();
    auto other = std::async(std::launch::async, [&] {
      return RunLinkSide(1, p2p_store, replica_store, true, nullptr);
    });
    absl::Status mine = RunLinkSide(0, p2p_store, replica_store, true, &result);
    if (!mine.ok()) p2p_store->Set("done/0", "1").IgnoreError();  // lets the other side end
    absl::Status theirs = other.get();
    PT_RETURN_IF_ERROR(mine);
    PT_RETURN_IF_ERROR(theirs);
  } else {
    PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> p2p_store,
                        rendezvous::ServeTcpStore("127.0.0.1", 0));
    PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> replica_store,
                        rendezvous::ServeTcpStore("127.0.0.1", 0));
    std::vector<std::string> args = peer_command;
    args.push_back(absl::StrCat(rendezvous::TcpStorePort(*p2p_store)));
    args.push_back(absl::StrCat(rendezvous::TcpStorePort(*replica_store)));
    subprocess::Options spawn;
    spawn.stdin_null = false;
    absl::StatusOr<pid_t> pid = subprocess::Start(args, spawn);
    if (!pid.ok()) {
      return absl::InternalError(absl::StrCat("cannot start the link peer ", args[0], ": ",
                                              pid.status().message()));
    }
    absl::Status mine = RunLinkSide(0, std::move(p2p_store), std::move(replica_store), false,
                                    &result);
    if (!mine.ok()) kill(*pid, SIGKILL);
    const int status = subprocess::Wait(*pid);
    PT_RETURN_IF_ERROR(mine);
    if (status < 0 || subprocess::ExitCode(status) != 0) {
      return absl::InternalError(absl::StrCat("the link peer process ",
                                              status < 0 ? "was lost" : subprocess::DescribeExit(status)));
    }
  }
  const double small = 4.0 * kSmallFloats, large = 4.0 * kLargeFloats;
  GlooLinks links;
  links.p2p = Fit(small, result.p2p_small, large, result.p2p_large);
  // A 2-rank ring AllReduce takes 2 latencies + bytes / bandwidth (profile.h).
  links.allreduce = Fit(small, result.ar_small, large, result.ar_large);
  links.allreduce.latency_s /= 2;
  links.allreduce_cpu = Fit(small, result.ar_cpu_small, large, result.ar_cpu_large);
  links.messages = std::move(result.messages);
  return links;
}

}  // namespace

absl::Status RunLinkPeer(int p2p_store_port, int replica_store_port) {
  SetIntraOpThreads(1);
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> p2p_store,
                      rendezvous::ConnectTcpStore("127.0.0.1", p2p_store_port, kLinkTimeout));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> replica_store,
                      rendezvous::ConnectTcpStore("127.0.0.1", replica_store_port, kLinkTimeout));
  return RunLinkSide(1, std::move(p2p_store), std::move(replica_store), false, nullptr);
}

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
  int64_t budget = options.memory_budget_bytes;
  if (budget <= 0) {
    budget = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / 4;
  }
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
    profile.dtype = job::PrecisionName(config.precision);
    profile.tokens_per_sample = plan->model_config.name == "gpt" ? plan->model_config.seq_len : 1;
    profile.model = absl::StrCat(plan->model_config.name, ", ", plan->layers.size(), " layers, ",
                                 plan->num_parameters(), " parameters");
    const std::vector<std::pair<int, int>> windows = ProfileWindows(*plan, budget);
    const std::string key = CacheKey(*plan, config, b, options.threads, windows);
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
    for (const auto& [begin, end] : windows) {
      at::Tensor next;
      absl::StatusOr<std::vector<planner::LayerProfile>> layers =
          ProfileWindow(one, *plan, begin, end, x, targets, options, next);
      if (!layers.ok()) return layers.status();
      for (int l = begin; l < end; ++l) {
        const planner::LayerProfile& layer = (*layers)[l - begin];
        say(absl::StrFormat("b=%d layer %d %s: forward %.2f ms, backward %.2f ms, update %.2f ms, "
                            "stash %.1f MB",
                            b, l, layer.name, layer.forward_s * 1e3, layer.backward_s * 1e3,
                            layer.optimizer_s * 1e3, layer.stash_bytes / 1e6));
        size.layers.push_back(layer);
      }
      x = next;
    }
    StoreValue(options.cache_dir, key, planner::MicroBatchProfileToJson(size));
    profile.sizes.push_back(std::move(size));
  }
  profile.receive_buffer_bytes = transport::GlooPostedReceiveBytes();
  profile.inline_buffer_bytes = transport::GlooInlinePayloadBytes();
  if (options.measure_links) {
    const std::string key =
        nlohmann::json{{"format", kProfileFormat}, {"links", "gloo loopback"},
                       {"threads", options.threads},
                       {"peer", options.link_peer_command.empty() ? "thread" : "process"}}
            .dump();
    if (MachineProfileFromOrNot(CachedValue(options.cache_dir, key), profile)) {
      say("links and cores: from the cache");
    } else {
      absl::StatusOr<GlooLinks> links = ProfileGlooLinks(options.link_peer_command);
      if (!links.ok()) return links.status();
      profile.p2p = links->p2p;
      profile.allreduce = links->allreduce;
      profile.allreduce_cpu = links->allreduce_cpu;
      profile.message_costs = links->messages;
      profile.slowdown = MeasureSlowdown(AvailableCores());
      StoreValue(options.cache_dir, key, planner::MachineProfileToJson(profile));
    }
    for (const planner::MessageCost& c : profile.message_costs) {
      say(absl::StrFormat("message of %d bytes between busy ranks: %.1f us on the way; CPU "
                          "%.1f us to send, %.1f us to receive, %.1f us in the transport's "
                          "threads",
                          c.bytes, c.latency_s * 1e6, c.send_s * 1e6, c.recv_s * 1e6,
                          c.background_s * 1e6));
    }
    say(absl::StrFormat("links (Gloo, loopback): point to point %.1f us + %.2f GB/s; AllReduce "
                        "of 2 %.1f us + %.2f GB/s (CPU per rank %.1f us + %.2f GB/s); computing "
                        "on 1..%d cores at once: %s x",
                        profile.p2p.latency_s * 1e6, profile.p2p.bytes_per_s / 1e9,
                        profile.allreduce.latency_s * 1e6, profile.allreduce.bytes_per_s / 1e9,
                        profile.allreduce_cpu.latency_s * 1e6,
                        profile.allreduce_cpu.bytes_per_s / 1e9,
                        static_cast<int>(profile.slowdown.size()),
                        absl::StrJoin(profile.slowdown, " ", [](std::string* out, double f) {
                          absl::StrAppendFormat(out, "%.2f", f);
                        })));
  }
  return profile;
}

}  // namespace pipetrain::profiler
