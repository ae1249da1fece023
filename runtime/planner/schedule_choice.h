// Every schedule on the shape a planner chose: the same ranks p, replicas, micro-batching and
// recomputation, each schedule's model stages balanced over the layers (v x p of them for the
// schedules with chunks, split by the profile's compute time), predicted side by side
// (Predict), and the fastest that fits among those that keep the chosen one's semantics:
// the flushing schedules (gpipe, 1f1b, interleaved, zb1p, zbv, dualpipev) compute the same
// updates, 2bw and pipedream each their own stale ones, so none stands in for another.
// What `pipetrain plan` prints under "schedules". Pure; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "runtime/planner/planners.h"
#include "runtime/planner/predict.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

struct ScheduleOption {
  schedule::ScheduleKind schedule = schedule::ScheduleKind::kOneFOneB;
  bool valid = false;           // the shape meets the schedule's rules and the layers suffice
  Candidate candidate;          // valid: its layout and prediction (fits against the cluster)
  bool same_semantics = false;  // computes the chosen schedule's updates
  bool best = false;            // the fastest valid one that fits with the same semantics
  std::string why;              // best: ""; otherwise why it lost (a rule, memory, time, semantics)
};

// The options in a fixed order: gpipe, 1f1b, 2bw, pipedream, interleaved (v = 2), zb1p
// (v = 1), zbv, dualpipev. `chosen` is a planner's layout (one stage a rank).
std::vector<ScheduleOption> CompareSchedules(const ModelProfile& profile,
                                             const ClusterProfile& cluster, const Layout& chosen);

// Contiguous layer ranges, `parts` of them, each non-empty, balancing forward + backward
// time (the largest part as small as a greedy split makes it). Empty when parts > layers.
std::vector<std::pair<int, int>> BalancedLayerRanges(const std::vector<LayerProfile>& layers,
                                                     int parts);

}  // namespace pipetrain::planner
