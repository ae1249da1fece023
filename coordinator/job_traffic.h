// What the coordinator knows of a job's model by formula (no LibTorch, no files opened): its
// layers sized by the job's data, the layers of each stage, and the traffic between its ranks;
// and from that traffic, where the ranks of a job go when the workers are on several hosts
// (docs/planning.md "Hosts").
//
// Pure functions; thread-compatible.
#pragma once

#include <optional>
#include <vector>

#include "coordinator/placement.h"
#include "runtime/job/job_spec.h"
#include "runtime/model/model_config.h"
#include "runtime/model/partition.h"
#include "runtime/model/pipeline_layout.h"
#include "runtime/planner/profile.h"

namespace pipetrain::coordinator {

// The job's model with the sizes its data gives it (a token model's vocabulary and sequence
// length), as every rank builds it.
model::ModelConfig ModelSizedByData(const job::JobSpec& config);

// The layers of each stage of `layout`: its own ranges, else balanced by parameter count as
// the job balances them. nullopt when the counts cannot be split so.
std::optional<std::vector<model::LayerRange>> StageRanges(
    const model::PipelineLayout& layout, const std::vector<model::LayerInfo>& layers);

// The job's traffic as a planner profile of one micro-batch size (the job's): per layer of a
// built-in model its output bytes (in the job's compute dtype: what crosses a stage boundary,
// and its gradient back) and parameter bytes (what an AllReduce averages), every cost in time
// zero. nullopt for a TorchScript model (known only once loaded) or a config the formulas
// refuse.
std::optional<planner::ModelProfile> TrafficProfile(const job::JobSpec& config);

// Links the coordinator assumes without a measurement: within a host (loopback), and between
// hosts unless the coordinator was given `pipetrain profile-link`'s (--host-links).
inline constexpr planner::LinkProfile kWithinHostLink{50e-6, 2e9};
inline constexpr planner::LinkProfile kBetweenHostsLink{200e-6, 125e6};  // 1 Gbit/s

// Where the job's ranks go on hosts: the placement (planner/host_placement.h) whose transfers
// the simulation of its traffic alone finishes first (computing taken as free, so the
// placement that moves the fewest bytes between hosts on the critical path), on the links
// within a host (kWithinHostLink) and between (`between`, else kBetweenHostsLink). For a job
// without a traffic profile it answers nothing (pool order). The work is done when it is
// asked; `config` must outlive it (it is made and asked within one scheduling pass).
HostPlacer MakeHostPlacer(const job::JobSpec& config, const planner::HostLinks& between);

}  // namespace pipetrain::coordinator
