// A planned layout (runtime/planner) applied to a job: what pipetrain-run does with `stages:
// auto` before it runs a job, and what the coordinator does when it plans a submitted one.
// No LibTorch (the coordinator links it).
#pragma once

#include <string>
#include <vector>

#include "pipetrain/v1/job.pb.h"
#include "runtime/job/job_spec.h"
#include "runtime/planner/planners.h"

namespace pipetrain::jobspec {

// The planner's request for `config`: its planner, its global batch (replicas x micro-batches
// x micro-batch size), its overlap and bucket size; every micro-batch size (none excluded).
planner::PlanRequest PlanRequestFor(const job::JobSpec& config);

// `config` with the layout's schedule (and its model stages a rank), stage ranges, replicas,
// micro-batch size and count, overlap and recomputed layers, and `stages: auto` cleared.
job::JobSpec WithLayout(const job::JobSpec& config, const planner::Layout& layout);

// What `stages: auto` runs: the schedule `pipetrain plan` marks on the planner's chosen shape
// (planner::CompareSchedules: the fastest predicted that fits among those computing the same
// updates, with its model stages balanced over the layers) where `config` validates with it
// (a job on GPUs refuses the schedules with chunks) and the ranks are on one host (the
// comparison does not place ranks on hosts); otherwise the planner's own layout. Makes it
// `plan->chosen` (its memory efficiency against the plan's data-parallel reference) and
// returns a line saying so ("runs zbv, ...: ..."), or "" where the chosen one stays.
std::string RunMarkedSchedule(const planner::ModelProfile& profile,
                              const planner::ClusterProfile& cluster, const job::JobSpec& config,
                              planner::PlanResult* plan);

// `spec` to be planned anew (`pipetrain plan`, `profile`): `stages: auto`, its own layer
// ranges dropped (the plan replaces its layout, so they are not checked).
void MarkForPlanning(job::JobSpec* spec);

// The global indices of the layers `layout` recomputes.
std::vector<int> RecomputedLayers(const planner::Layout& layout);

// "0:3,3:7"
std::string FormatStageRanges(const planner::Layout& layout);

// "1f1b, 2 stages (0:3,3:7) x 2 replicas, 8 micro-batches of 4, recompute layers 1,2"
std::string DescribeLayout(const planner::Layout& layout);

// What the job record keeps of a plan: the planner, the layout in words and its predictions.
v1::PlannedLayout PlannedLayoutRecord(const planner::PlanResult& plan,
                                      const planner::ClusterProfile& cluster);

}  // namespace pipetrain::jobspec
