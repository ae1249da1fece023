// The planner tests' layouts: `layers` layers split evenly over `p` stages.
#pragma once

#include <utility>
#include <vector>

#include "runtime/planner/predict.h"

namespace pipetrain::planner {

// `kind` over p stages of layers / p layers each (the last ones take what is left), w
// replicas, m micro-batches per step.
inline Layout Even(schedule::ScheduleKind kind, int layers, int p, int m, int w = 1) {
  Layout layout;
  layout.schedule = kind;
  std::vector<std::pair<int, int>> stage_layers;
  for (int s = 0; s < p; ++s) stage_layers.emplace_back(s * layers / p, (s + 1) * layers / p);
  layout.SetStageLayers(std::move(stage_layers));
  layout.pipeline.micro_batches = m;
  layout.pipeline.replicas = w;
  return layout;
}

}  // namespace pipetrain::planner
