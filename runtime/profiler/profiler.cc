// The profiler's entry points: a job's profile (per micro-batch size its layers, then the
// links and cores), each part from the cache or measured, and the cache's default directory.
// The measuring is in layer_profiling.cc and machine_profiling.cc, the cache in
// profile_cache.cc.
#include "runtime/profiler/profiler.h"

#include <algorithm>
#include <cstdlib>

#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/threads.h"
#include "runtime/job/plan.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/planner/profile_json.h"
#include "runtime/profiler/layer_profiling.h"
#include "runtime/profiler/machine_profiling.h"
#include "runtime/profiler/profile_cache.h"
#include "runtime/transport/gloo/gloo_transport.h"

namespace pipetrain::profiler {

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

absl::StatusOr<planner::ModelProfile> ProfileJob(const job::JobSpec& config,
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
  if (sizes.empty()) sizes.push_back(config.microbatch_size());
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };

  planner::ModelProfile profile;
  profile.threads = options.threads;
  for (int b : sizes) {
    const int64_t before_plan = memory::TensorBytesInUse();
    job::JobSpec one = config;
    one.set_stages(1);
    one.clear_stage_ranges();
    one.set_replicas(1);
    one.set_microbatches(1);
    one.set_microbatch_size(b);
    job::SetRecompute(one, {});
    one.set_auto_stages(false);  // one stage, whatever the job's layout will be
    // Layers cost the same under every schedule (one whose rules need several ranks or
    // micro-batches would refuse this job).
    job::SetSchedule(one, schedule::ScheduleKind::kOneFOneB);
    one.set_virtual_stages(0);
    one.set_vertical_sync(false);
    if (absl::Status s = job::ValidateJob(one); !s.ok()) return s;
    absl::StatusOr<job::JobPlan> plan = job::MakeJobPlan(one);
    if (!plan.ok()) return plan.status();
    // What the dataset holds (every rank loads it).
    profile.base_bytes =
        std::max<int64_t>(profile.base_bytes, memory::TensorBytesInUse() - before_plan);
    profile.dtype = job::PrecisionName(job::PrecisionOf(config));
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
        say(
            absl::StrFormat("b=%d layer %d %s: forward %.2f ms, backward %.2f ms, update %.2f ms, "
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
        nlohmann::json{{"format", kProfileFormat},
                       {"links", "gloo loopback"},
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
      say(absl::StrFormat(
          "message of %d bytes between busy ranks: %.1f us on the way; CPU "
          "%.1f us to send, %.1f us to receive, %.1f us in the transport's "
          "threads",
          c.bytes, c.latency_s * 1e6, c.send_s * 1e6, c.recv_s * 1e6, c.background_s * 1e6));
    }
    say(absl::StrFormat(
        "links (Gloo, loopback): point to point %.1f us + %.2f GB/s; AllReduce "
        "of 2 %.1f us + %.2f GB/s (CPU per rank %.1f us + %.2f GB/s); computing "
        "on 1..%d cores at once: %s x",
        profile.p2p.latency_s * 1e6, profile.p2p.bytes_per_s / 1e9,
        profile.allreduce.latency_s * 1e6, profile.allreduce.bytes_per_s / 1e9,
        profile.allreduce_cpu.latency_s * 1e6, profile.allreduce_cpu.bytes_per_s / 1e9,
        static_cast<int>(profile.slowdown.size()),
        absl::StrJoin(profile.slowdown, " ",
                      [](std::string* out, double f) { absl::StrAppendFormat(out, "%.2f", f); })));
  }
  return profile;
}

}  // namespace pipetrain::profiler
