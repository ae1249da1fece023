#include "run/plan_command.h"

#include <cstdio>
#include <numeric>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "jobspec/planned_layout.h"
#include "runtime/base/byte_size.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/self_executable.h"
#include "runtime/base/threads.h"
#include "runtime/job/plan.h"
#include "runtime/planner/host_placement.h"
#include "runtime/planner/profile_json.h"
#include "runtime/planner/schedule_choice.h"
#include "runtime/profiler/profiler.h"
#include "runtime/schedule/chunked_schedule.h"

namespace pipetrain::run {
namespace {

using planner::Candidate;
using planner::Layout;

using jobspec::RecomputedLayers;

std::string Ranges(const Layout& layout) { return jobspec::FormatStageRanges(layout); }

nlohmann::json CandidateJson(const Candidate& c) {
  const Layout& l = c.layout;
  nlohmann::json stages = nlohmann::json::array(), memory = nlohmann::json::array(),
                 compute = nlohmann::json::array(), exposed = nlohmann::json::array();
  for (const auto& [b, e] : l.pipeline.stage_layers) stages.push_back({b, e});
  for (const planner::StagePrediction& s : c.prediction.stages) {
    memory.push_back(s.peak_memory_bytes);
    compute.push_back(s.compute_s);
    exposed.push_back(s.exposed_allreduce_s);
  }
  nlohmann::json j = {{"schedule", std::string(schedule::ScheduleKindName(l.schedule))},
                      {"stages", stages},
                      {"replicas", l.pipeline.replicas},
                      {"microbatch_size", l.pipeline.micro_batch_size},
                      {"microbatches", l.pipeline.micro_batches},
                      {"recompute", RecomputedLayers(l)},
                      {"overlap_allreduce", l.overlap_allreduce},
                      {"bucket_kib", l.bucket_bytes >> 10},
                      {"predicted_step_time_s", c.prediction.step_time_s},
                      {"predicted_samples_per_s", c.prediction.samples_per_s},
                      {"predicted_tokens_per_s", c.prediction.tokens_per_s},
                      {"predicted_peak_memory_bytes", memory},
                      {"predicted_compute_s", compute},
                      {"predicted_exposed_allreduce_s", exposed},
                      {"memory_efficiency", c.memory_efficiency},
                      {"fits", c.fits}};
  if (!l.rank_hosts.empty()) j["rank_hosts"] = l.rank_hosts;
  // Ranks holding several model stages: `stages` lists the model stages, predictions go by rank.
  if (l.virtual_stages > 1) j["virtual_stages"] = l.virtual_stages;
  if (!c.why.empty()) j["why"] = c.why;
  return j;
}

}  // namespace

namespace {

planner::PlanRequest PlanRequestFor(const job::JobSpec& config, const jobspec::PlanFlags& flags) {
  planner::PlanRequest request = jobspec::PlanRequestFor(config);
  request.micro_batch_sizes = flags.micro_batch_sizes;
  return request;
}

}  // namespace

absl::StatusOr<planner::ClusterProfile> ClusterFor(const planner::ModelProfile& profile,
                                                   const jobspec::PlanFlags& flags) {
  planner::ClusterProfile cluster;
  cluster.workers = flags.workers > 0 ? flags.workers : AvailableCores();
  cluster.memory_bytes = flags.memory_per_worker;
  cluster.link = profile.p2p;
  cluster.allreduce = profile.allreduce;
  cluster.shared_cores = flags.shared_cores >= 0 ? flags.shared_cores : AvailableCores();
  if (flags.hosts.empty()) return cluster;
  const int on_hosts = std::accumulate(flags.hosts.begin(), flags.hosts.end(), 0);
  if (flags.workers > 0 && flags.workers != on_hosts) {
    return absl::InvalidArgumentError(absl::StrCat("--hosts ", absl::StrJoin(flags.hosts, ","),
                                                   " has ", on_hosts, " workers; --workers says ",
                                                   flags.workers));
  }
  cluster.workers = on_hosts;
  cluster.host_workers = flags.hosts;
  planner::HostLinks links = profile.between_hosts;
  if (!flags.host_links.empty()) {
    absl::StatusOr<std::string> text = ReadRegularFile(flags.host_links, 1 << 20, "host links");
    if (!text.ok()) return text.status();
    absl::StatusOr<planner::HostLinks> read = planner::HostLinksFromJson(*text);
    if (!read.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--host-links ", flags.host_links, ": ", read.status().message()));
    }
    links = *read;
  }
  cluster.between_hosts = links.p2p;
  cluster.between_hosts_allreduce = links.allreduce;
  return cluster;
}

absl::StatusOr<planner::ModelProfile> ProfileForPlanning(const job::JobSpec& config,
                                                         const jobspec::PlanFlags& flags) {
  profiler::ProfileOptions options;
  options.micro_batch_sizes = flags.micro_batch_sizes;
  if (options.micro_batch_sizes.empty()) {
    const int global_batch = jobspec::PlanRequestFor(config).global_batch;
    for (int b = 1; b <= global_batch; ++b) {
      if (global_batch % b == 0) options.micro_batch_sizes.push_back(b);
    }
  }
  options.threads = 1;  // ranks sharing a machine's cores run one thread each
  // The links are measured between processes, as ranks run: this program is the peer.
  if (const std::string self = SelfExecutable(); !self.empty()) {
    options.link_peer_command = {self, "--profile-link-peer"};
  }
  if (!flags.no_cache) options.cache_dir = profiler::DefaultProfileCacheDir();
  if (!flags.quiet) {
    options.progress = [](const std::string& line) {
      std::fprintf(stderr, "profile: %s\n", line.c_str());
    };
  }
  return profiler::ProfileJob(config, options);
}

std::string PlanToJson(const planner::PlanResult& plan, const planner::ModelProfile& profile,
                       const planner::ClusterProfile& cluster) {
  nlohmann::json j = CandidateJson(plan.chosen);
  j["planner"] = std::string(planner::PlannerKindName(plan.planner));
  j["model"] = profile.model;
  j["workers"] = cluster.workers;
  j["memory_per_worker_bytes"] = cluster.memory_bytes;
  j["shared_cores"] = cluster.shared_cores;
  j["layouts_considered"] = plan.considered;
  j["data_parallel"] = CandidateJson(plan.data_parallel);
  j["alternatives"] = nlohmann::json::array();
  for (const Candidate& c : plan.alternatives) j["alternatives"].push_back(CandidateJson(c));
  // Every schedule on the chosen shape, and why each lost.
  j["schedules"] = nlohmann::json::array();
  for (const planner::ScheduleOption& o :
       planner::CompareSchedules(profile, cluster, plan.chosen.layout)) {
    nlohmann::json s = o.valid ? CandidateJson(o.candidate) : nlohmann::json::object();
    s["schedule"] = std::string(schedule::ScheduleKindName(o.schedule));
    s["valid"] = o.valid;
    s["same_semantics"] = o.same_semantics;
    s["best"] = o.best;
    s["why"] = o.why;
    j["schedules"].push_back(std::move(s));
  }
  return j.dump(2);
}

std::string PlanToText(const planner::PlanResult& plan, const planner::ModelProfile& profile,
                       const planner::ClusterProfile& cluster) {
  const Candidate& c = plan.chosen;
  const Layout& l = c.layout;
  const bool tokens = profile.tokens_per_sample > 1;
  std::string out = absl::StrFormat(
      "%s planner: %s on %d workers%s, global batch %d (%d layouts considered)\n",
      planner::PlannerKindName(plan.planner), profile.model, cluster.workers,
      cluster.memory_bytes > 0 ? absl::StrCat(" of ", ByteSize(cluster.memory_bytes)) : "",
      l.global_batch(), plan.considered);
  absl::StrAppend(&out, "  schedule ", jobspec::DescribeLayout(l), "\n");
  if (!l.rank_hosts.empty()) {
    absl::StrAppend(&out, "  on hosts ", absl::StrJoin(cluster.host_workers, ","),
                    ": the host of each rank (replica by replica) ",
                    absl::StrJoin(l.rank_hosts, ","), "\n");
  }
  absl::StrAppendFormat(&out,
                        "  predicted: step %.2f ms, %.0f %s/s, ME %.2f against data "
                        "parallelism (step %.2f ms, peak %s)\n",
                        c.prediction.step_time_s * 1e3,
                        tokens ? c.prediction.tokens_per_s : c.prediction.samples_per_s,
                        tokens ? "tok" : "samples", c.memory_efficiency,
                        plan.data_parallel.prediction.step_time_s * 1e3,
                        ByteSize(plan.data_parallel.prediction.peak_memory_bytes));
  absl::StrAppendFormat(&out, "  %-6s %-8s %-11s %-13s %-10s %s\n", "stage", "layers", "compute_ms",
                        "exposed_ar_ms", "in_flight", "peak_memory");
  // A rank holding several model stages lists their layers, in model order.
  schedule::ScheduleParams shape;
  shape.kind = l.schedule;
  shape.stages = l.stages();
  shape.virtual_stages = l.virtual_stages;
  const schedule::ChunkLayout chunks = schedule::LayoutOf(shape);
  std::vector<std::vector<std::string>> rank_layers(l.stages());
  for (size_t k = 0; k < l.pipeline.stage_layers.size(); ++k) {
    const int rank = chunks.RankOf(static_cast<int>(k));
    rank_layers[rank].push_back(
        absl::StrCat(l.pipeline.stage_layers[k].first, ":", l.pipeline.stage_layers[k].second));
  }
  for (int s = 0; s < l.stages(); ++s) {
    const planner::StagePrediction& p = c.prediction.stages[s];
    absl::StrAppendFormat(&out, "  %-6d %-8s %-11.2f %-13.2f %-10d %s\n", s,
                          absl::StrJoin(rank_layers[s], ","), p.compute_s * 1e3,
                          p.exposed_allreduce_s * 1e3, p.peak_in_flight,
                          ByteSize(p.peak_memory_bytes));
  }
  out +=
      "schedules on this shape (the fastest that fits with the same semantics marked *: "
      "what `stages: auto` runs on one host):\n";
  for (const planner::ScheduleOption& o : planner::CompareSchedules(profile, cluster, l)) {
    const std::string name(schedule::ScheduleKindName(o.schedule));
    if (!o.valid) {
      absl::StrAppendFormat(&out, "    %-16s %s\n", name, o.why);
      continue;
    }
    absl::StrAppendFormat(&out, "  %s %-16s step %.2f ms, peak %s%s%s\n", o.best ? "*" : " ",
                          o.candidate.layout.virtual_stages > 1
                              ? absl::StrCat(name, " v=", o.candidate.layout.virtual_stages)
                              : name,
                          o.candidate.prediction.step_time_s * 1e3,
                          ByteSize(o.candidate.prediction.peak_memory_bytes),
                          o.why.empty() ? "" : ": ", o.why);
  }
  if (!plan.alternatives.empty()) out += "alternatives (the best of each other shape):\n";
  for (const Candidate& a : plan.alternatives) {
    const std::vector<int> r = RecomputedLayers(a.layout);
    absl::StrAppendFormat(
        &out, "  p=%d w=%d b=%d m=%d stages %s%s: step %.2f ms, peak %s: %s\n", a.layout.stages(),
        a.layout.pipeline.replicas, a.layout.pipeline.micro_batch_size,
        a.layout.pipeline.micro_batches, Ranges(a.layout),
        r.empty() ? "" : absl::StrCat(" recompute ", absl::StrJoin(r, ",")),
        a.prediction.step_time_s * 1e3, ByteSize(a.prediction.peak_memory_bytes), a.why);
  }
  return out;
}

absl::StatusOr<planner::Layout> LayoutOf(const job::JobSpec& config) {
  absl::StatusOr<job::JobPlan> plan = job::MakeJobPlan(config);
  if (!plan.ok()) return plan.status();
  planner::Layout layout;
  layout.schedule = job::ScheduleOf(config);
  std::vector<std::pair<int, int>> stage_layers;
  for (const model::LayerRange& r : plan->partition) stage_layers.emplace_back(r.begin, r.end);
  if (schedule::HoldsChunks(job::ScheduleOf(config))) {
    layout.SetModelStageLayers(std::move(stage_layers), plan->layout.chunks_per_rank);
  } else {
    layout.SetStageLayers(std::move(stage_layers));
  }
  layout.pipeline.replicas = config.replicas();
  layout.pipeline.micro_batch_size = config.microbatch_size();
  layout.pipeline.micro_batches = config.microbatches();
  layout.recompute = plan->recompute;
  layout.overlap_allreduce = config.overlap_allreduce();
  layout.bucket_bytes = config.bucket_kib() * 1024;
  layout.vertical_sync = config.vertical_sync();
  return layout;
}

absl::StatusOr<AppliedPlan> PlanAndApply(const jobspec::PlanFlags& flags,
                                         const job::JobSpec& config) {
  absl::StatusOr<planner::ModelProfile> profile = ProfileForPlanning(config, flags);
  if (!profile.ok()) return profile.status();
  absl::StatusOr<planner::ClusterProfile> on = ClusterFor(*profile, flags);
  if (!on.ok()) return on.status();
  const planner::ClusterProfile& cluster = *on;
  absl::StatusOr<planner::PlanResult> plan =
      planner::MakePlan(*profile, cluster, PlanRequestFor(config, flags));
  if (!plan.ok()) return plan.status();
  if (!flags.quiet) {
    const std::string text = PlanToText(*plan, *profile, cluster);
    // The chosen layout only (the lines before the other schedules and shapes).
    std::fprintf(stderr, "%s", text.substr(0, text.find("schedules on this shape")).c_str());
  }
  const std::string marked = jobspec::RunMarkedSchedule(*profile, cluster, config, &*plan);
  if (!flags.quiet && !marked.empty()) {
    std::fprintf(stderr, "%s: %s\n", marked.c_str(),
                 jobspec::DescribeLayout(plan->chosen.layout).c_str());
  }
  return AppliedPlan{jobspec::WithLayout(config, plan->chosen.layout),
                     jobspec::PlannedLayoutRecord(*plan, cluster)};
}

int RunPlanCommand(const jobspec::PlanFlags& flags, const job::JobSpec& config) {
  const auto fail = [](const absl::Status& s, int code) {
    std::fprintf(stderr, "pipetrain: %s\n", std::string(s.message()).c_str());
    return code;
  };
  absl::StatusOr<planner::ModelProfile> profile = ProfileForPlanning(config, flags);
  if (!profile.ok()) return fail(profile.status(), exit_code::For(profile.status()));
  if (flags.profile) {
    std::printf("%s\n", planner::ModelProfileToJson(*profile).c_str());
    return exit_code::kOk;
  }
  absl::StatusOr<planner::ClusterProfile> on = ClusterFor(*profile, flags);
  if (!on.ok()) return fail(on.status(), exit_code::kUsage);
  const planner::ClusterProfile& cluster = *on;
  if (flags.predict) {
    absl::StatusOr<planner::Layout> layout = LayoutOf(config);
    if (!layout.ok()) return fail(layout.status(), exit_code::For(layout.status()));
    // Every placement on the hosts (one without hosts), the fastest first.
    absl::StatusOr<std::vector<planner::HostPlacement>> placements =
        planner::RankHostPlacements(*profile, cluster, *layout);
    if (!placements.ok()) return fail(placements.status(), exit_code::kUsage);
    planner::Candidate c;
    c.layout = *layout;
    c.layout.rank_hosts = placements->front().rank_hosts;
    c.prediction = placements->front().prediction;
    const planner::Prediction* prediction = &c.prediction;
    c.fits = cluster.memory_bytes <= 0 ||
             prediction->peak_memory_bytes <= planner::PlannableBytes(cluster.memory_bytes);
    nlohmann::json j = CandidateJson(c);
    j["model"] = profile->model;
    j["shared_cores"] = cluster.shared_cores;
    if (cluster.hosts() > 1) {
      j["hosts"] = cluster.host_workers;
      j["placements"] = nlohmann::json::array();
      for (const planner::HostPlacement& p : *placements) {
        j["placements"].push_back({{"placement", std::string(planner::HostOrderName(p.order))},
                                   {"rank_hosts", p.rank_hosts},
                                   {"predicted_step_time_s", p.prediction.step_time_s}});
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return exit_code::kOk;
  }
  absl::StatusOr<planner::PlanResult> plan =
      planner::MakePlan(*profile, cluster, PlanRequestFor(config, flags));
  if (!plan.ok()) {
    return fail(plan.status(), plan.status().code() == absl::StatusCode::kResourceExhausted
                                   ? exit_code::kJobFailed
                                   : exit_code::kUsage);
  }
  const std::string text = flags.output == "json" ? PlanToJson(*plan, *profile, cluster)
                                                  : PlanToText(*plan, *profile, cluster);
  std::printf("%s\n", text.c_str());
  return exit_code::kOk;
}

}  // namespace pipetrain::run
