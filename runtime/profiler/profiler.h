// Measures what the planners need (runtime/planner/profile.h) on this machine: each layer of a
// job's model, one at a time, and the transport the job's stages would use between processes.
//
// A layer is built alone from (seed, layer index) and fed the real micro-batch of the job's
// data (layer 0) or the previous layer's real output; the last layer's forward includes the
// loss. Per micro-batch size, after `warmup` untimed rounds, the median of `repeats` rounds of:
//   forward_s    its forward (with autograd recording, as in training);
//   backward_s   its backward from a gradient of its output's shape;
//   optimizer_s  one update of its parameters by the job's optimizer;
// and, counted at the CPU allocator (runtime/memory):
//   output_bytes    its output; parameter_bytes its parameters;
//   optimizer_bytes what the optimizer's first update allocated;
//   stash_bytes     what the forward left allocated besides its output (kept for backward);
//   working_bytes   the most the backward allocated above that;
//   base_bytes      what the job's dataset holds (every rank loads it).
// Only one layer exists at a time, so profiling a model needs about one layer's memory.
// The links: two Gloo transports over loopback in this process, a ping-pong of activations
// and a 2-rank AllReduce at two sizes, fitted to latency + bytes / bandwidth. The cores: how
// much slower a matrix product and GELU run on k threads at once than alone (slowdown).
//
// Results are cached by (model, dtype, optimizer, micro-batch size, threads, device, the
// measuring executable's size and time) under `cache_dir`, one JSON file each; a cached size
// is not measured again (a new build measures again).
// Sets the process's intra-op threads to `threads` and installs the tensor-memory counter.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/job/job_config.h"
#include "runtime/planner/profile.h"

namespace pipetrain::profiler {

struct ProfileOptions {
  std::vector<int> micro_batch_sizes;  // empty: the job's micro_batch_size
  int threads = 1;                     // intra-op threads, as each rank will run
  int warmup = 1;
  int repeats = 3;
  bool measure_links = true;           // false: p2p and allreduce are left at their defaults
  std::string cache_dir;               // "": no cache
  // Called with a line of progress ("block3 at b=8: forward 12.1 ms ...") as work is done.
  std::function<void(const std::string&)> progress;
};

// InvalidArgument for a job that does not validate or a micro-batch size < 1 or above the
// job's limits; what MakeJobPlan says about the data or a model file.
absl::StatusOr<planner::ModelProfile> ProfileJob(const job::JobConfig& config,
                                                 const ProfileOptions& options);

// The default cache directory: $PIPETRAIN_CACHE_DIR, else $XDG_CACHE_HOME/pipetrain/profiles,
// else $HOME/.cache/pipetrain/profiles ("" when none is set).
std::string DefaultProfileCacheDir();

}  // namespace pipetrain::profiler
