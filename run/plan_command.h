// `pipetrain plan` and `pipetrain profile`, run by pipetrain-run (they measure the model, so
// they need LibTorch; the pipetrain CLI hands them over like `run --launch threads`).
//
//   plan:    profiles the job's model at every micro-batch size the planner may choose (cached,
//            runtime/profiler) and the Gloo links, runs the chosen planner (runtime/planner) for
//            `workers` workers of `memory_per_worker` bytes, and prints the layout, its predicted
//            step time, throughput and per-stage peak memory, and the best layout of every other
//            shape with why it lost (text, or JSON with -o json).
//   profile: prints the profile itself (JSON).
// The planner is the job's `planner`; the global batch is the job's: replicas x micro-batches
// x micro-batch size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "jobspec/plan_flags.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/job/job_spec.h"
#include "runtime/planner/planners.h"
#include "runtime/planner/profile.h"

namespace pipetrain::run {

// Profiles `config` for `flags` (progress on stderr unless quiet).
absl::StatusOr<planner::ModelProfile> ProfileForPlanning(const job::JobSpec& config,
                                                         const jobspec::PlanFlags& flags);

// The cluster `flags` describe: --plan-workers (default this machine's cores) of
// --memory-per-worker, sharing --shared-cores (default this machine's), on the profile's links;
// with --hosts, as many workers as the hosts have, the links between them from --host-links
// (else the profile's between_hosts, else as within a host). InvalidArgument for --hosts
// whose sum differs from --workers, or a --host-links file that does not parse.
absl::StatusOr<planner::ClusterProfile> ClusterFor(const planner::ModelProfile& profile,
                                                   const jobspec::PlanFlags& flags);

// The plan as JSON (the -o json of `pipetrain plan`) and as text.
std::string PlanToJson(const planner::PlanResult& plan, const planner::ModelProfile& profile,
                       const planner::ClusterProfile& cluster);
std::string PlanToText(const planner::PlanResult& plan, const planner::ModelProfile& profile,
                       const planner::ClusterProfile& cluster);

// The layout `config` runs (its partition and recomputation resolved as a run resolves them).
absl::StatusOr<planner::Layout> LayoutOf(const job::JobSpec& config);

// Profiles and plans `config` (a job with `stages: auto`) and returns it with the plan's
// layout, and the plan's record (what a cluster's job keeps: the summary's "plan"); the plan
// is summed up on stderr unless quiet. ResourceExhausted when nothing fits.
struct AppliedPlan {
  job::JobSpec config;
  v1::PlannedLayout record;
};
absl::StatusOr<AppliedPlan> PlanAndApply(const jobspec::PlanFlags& flags,
                                         const job::JobSpec& config);

// The whole command: 0 ok, 1 no plan fits, 2 bad input.
int RunPlanCommand(const jobspec::PlanFlags& flags, const job::JobSpec& config);

}  // namespace pipetrain::run
