#include "jobspec/planned_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/planner/schedule_choice.h"

namespace pipetrain::jobspec {

std::vector<int> RecomputedLayers(const planner::Layout& layout) {
  std::vector<int> layers;
  for (int l = 0; l < static_cast<int>(layout.recompute.size()); ++l) {
    if (layout.recompute[l]) layers.push_back(l);
  }
  return layers;
}

std::string FormatStageRanges(const planner::Layout& layout) {
  std::vector<std::string> parts;
  for (const auto& [b, e] : layout.pipeline.stage_layers) parts.push_back(absl::StrCat(b, ":", e));
  return absl::StrJoin(parts, ",");
}

std::string DescribeLayout(const planner::Layout& l) {
  const std::vector<int> recomputed = RecomputedLayers(l);
  return absl::StrCat(
      std::string(schedule::ScheduleKindName(l.schedule)), ", ", l.stages(), " stage",
      l.stages() == 1 ? "" : "s", " (", FormatStageRanges(l), ") x ", l.pipeline.replicas,
      " replica", l.pipeline.replicas == 1 ? "" : "s", ", ", l.pipeline.micro_batches,
      " micro-batch", l.pipeline.micro_batches == 1 ? "" : "es", " of ",
      l.pipeline.micro_batch_size, ", recompute ",
      recomputed.empty() ? "none" : absl::StrCat("layers ", absl::StrJoin(recomputed, ",")),
      l.pipeline.replicas == 1 ? ""
      : l.overlap_allreduce
          ? absl::StrCat(", AllReduce overlapped in buckets of ", l.bucket_bytes >> 10, " KiB")
          : ", AllReduce after the backward");
}

planner::PlanRequest PlanRequestFor(const job::JobSpec& config) {
  planner::PlanRequest request;
  // Validated with the job (ValidateJob), so it parses.
  request.planner =
      planner::ParsePlannerKind(config.planner()).value_or(planner::PlannerKind::kTwoBW);
  request.global_batch = config.replicas() * config.microbatches() * config.microbatch_size();
  request.overlap_allreduce = config.overlap_allreduce();
  request.bucket_bytes = config.bucket_kib() * 1024;
  return request;
}

void MarkForPlanning(job::JobSpec* spec) {
  spec->set_auto_stages(true);
  spec->clear_stage_ranges();
}

job::JobSpec WithLayout(const job::JobSpec& config, const planner::Layout& layout) {
  job::JobSpec c = config;
  c.set_auto_stages(false);
  job::SetSchedule(c, layout.schedule);
  c.set_stages(layout.stages());
  c.set_virtual_stages(schedule::HoldsChunks(layout.schedule) ? layout.virtual_stages : 0);
  c.clear_stage_ranges();
  for (const auto& [b, e] : layout.pipeline.stage_layers) {
    v1::LayerRange* range = c.add_stage_ranges();
    range->set_begin(b);
    range->set_end(e);
  }
  c.set_replicas(layout.pipeline.replicas);
  c.set_microbatch_size(layout.pipeline.micro_batch_size);
  c.set_microbatches(layout.pipeline.micro_batches);
  c.set_overlap_allreduce(layout.overlap_allreduce);
  c.set_bucket_kib(std::max<int64_t>(1, layout.bucket_bytes / 1024));
  job::RecomputeConfig recompute;
  const std::vector<int> layers = RecomputedLayers(layout);
  if (!layers.empty()) {
    recompute.mode = job::RecomputeConfig::Mode::kLayers;
    recompute.indices = layers;
  }
  job::SetRecompute(c, recompute);
  return c;
}

std::string RunMarkedSchedule(const planner::ModelProfile& profile,
                              const planner::ClusterProfile& cluster, const job::JobSpec& config,
                              planner::PlanResult* plan) {
  if (!plan->chosen.layout.rank_hosts.empty()) return "";
  for (planner::ScheduleOption& option :
       planner::CompareSchedules(profile, cluster, plan->chosen.layout)) {
    if (!option.best || option.schedule == plan->chosen.layout.schedule) continue;
    if (!job::ValidateJob(WithLayout(config, option.candidate.layout)).ok()) return "";
    const planner::Candidate& was = plan->chosen;
    std::string line = absl::StrFormat(
        "runs %s, the schedule marked on this shape (the same updates): predicted %.3f ms a "
        "step against %s's %.3f ms",
        schedule::ScheduleKindName(option.schedule), option.candidate.prediction.step_time_s * 1e3,
        schedule::ScheduleKindName(was.layout.schedule), was.prediction.step_time_s * 1e3);
    planner::Candidate& now = option.candidate;
    const planner::Prediction& dp = plan->data_parallel.prediction;
    if (dp.samples_per_s > 0 && dp.peak_memory_bytes > 0 && now.prediction.peak_memory_bytes > 0) {
      now.memory_efficiency = (now.prediction.samples_per_s / dp.samples_per_s) /
                              (static_cast<double>(now.prediction.peak_memory_bytes) /
                               static_cast<double>(dp.peak_memory_bytes));
    }
    plan->chosen = std::move(now);
    return line;
  }
  return "";
}

v1::PlannedLayout PlannedLayoutRecord(const planner::PlanResult& plan,
                                      const planner::ClusterProfile& cluster) {
  v1::PlannedLayout record;
  record.set_planner(std::string(planner::PlannerKindName(plan.planner)));
  record.set_layout(DescribeLayout(plan.chosen.layout));
  record.set_workers(cluster.workers);
  record.set_memory_per_worker_bytes(cluster.memory_bytes);
  record.set_shared_cores(cluster.shared_cores);
  const planner::Prediction& p = plan.chosen.prediction;
  record.set_predicted_step_time_s(p.step_time_s);
  record.set_predicted_samples_per_s(p.samples_per_s);
  record.set_predicted_tokens_per_s(p.tokens_per_s);
  for (const planner::StagePrediction& s : p.stages) {
    record.add_predicted_peak_memory_bytes(s.peak_memory_bytes);
  }
  record.set_memory_efficiency(plan.chosen.memory_efficiency);
  record.set_layouts_considered(plan.considered);
  return record;
}

}  // namespace pipetrain::jobspec
