// What the planners know of a model and of the machines it may run on: per layer, costs
// measured (or given) for one micro-batch of one size; per link, a latency and a bandwidth.
// Plain data, no LibTorch: planners are pure functions of these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::planner {

// Per layer, for one micro-batch of the model profile's micro_batch_size. Times and
// activation bytes are taken to scale linearly with the micro-batch size.
struct LayerProfile {
  std::string name;
  double forward_s = 0;         // one micro-batch
  double backward_s = 0;        // one micro-batch
  int64_t output_bytes = 0;     // the activation it hands to the next layer (and its gradient back)
  int64_t parameter_bytes = 0;  // one version of its parameters
  int64_t optimizer_bytes = 0;  // the optimizer's state for them (AdamW: 2 x parameter_bytes)
  int64_t stash_bytes = 0;      // what it keeps from a forward for its backward
};

struct LinkProfile {
  double latency_s = 0;     // per message
  double bytes_per_s = 1;   // > 0
};

struct ClusterProfile {
  int workers = 1;          // identical workers, one rank each
  LinkProfile link;         // between any two of them (activations, gradients, AllReduce)
  int64_t memory_bytes = 0; // each worker's (0: not limited)
};

}  // namespace pipetrain::planner
