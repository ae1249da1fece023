// The planner tests' layouts (`layers` layers split evenly over `p` stages) and profiles
// (uniform layers, free links).
#pragma once

#include <utility>
#include <vector>

#include "runtime/planner/predict.h"
#include "runtime/planner/profile.h"

namespace pipetrain::planner {

// `kind` over p stages of layers / p layers each (the last ones take what is left), w
// replicas, m micro-batches per step.
// `n` layers of forward f, backward 2f, optimizer `opt`, each with `parameter_bytes` of
// parameters (twice that of optimizer state), 100 bytes of output, 400 of stash and 50 of
// working memory; 10 tokens a sample.
inline ModelProfile Uniform(int n, double f, double opt = 0, int64_t parameter_bytes = 1000) {
  ModelProfile profile;
  profile.tokens_per_sample = 10;
  MicroBatchProfile size;
  size.micro_batch_size = 1;
  for (int l = 0; l < n; ++l) {
    LayerProfile layer;
    layer.forward_s = f;
    layer.backward_s = 2 * f;
    layer.optimizer_s = opt;
    layer.output_bytes = 100;
    layer.parameter_bytes = parameter_bytes;
    layer.optimizer_bytes = 2 * parameter_bytes;
    layer.stash_bytes = 400;
    layer.working_bytes = 50;
    size.layers.push_back(layer);
  }
  profile.sizes.push_back(size);
  return profile;
}

// Links that cost nothing, 8 workers, no shared cores.
inline ClusterProfile FreeLinks() {
  ClusterProfile cluster;
  cluster.workers = 8;
  cluster.link = {0, 1e30};
  return cluster;
}

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
