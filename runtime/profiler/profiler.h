// Measures what the planners need (runtime/planner/profile.h) on this machine: each layer of a
// job's model, and the transport the job's stages would use between processes.
//
// Layers are built from (seed, layer index) and run as a stage runs them: per round, a
// forward through consecutive layers on the real micro-batch of the job's data (the last
// layer's includes the loss), a backward through them in reverse, each from the gradient the
// next layer produced, then each layer's update; so every layer meets the caches as it does
// inside a stage. Each layer's input is detached from the previous output, so its work is
// timed alone. Per micro-batch size, after `warmup` untimed rounds, the median of `repeats`
// rounds of:
//   forward_s    its forward (with autograd recording, as in training);
//   backward_s   its backward;
//   optimizer_s  its update: the finiteness check of its gradients and the optimizer's step;
// and, counted at the CPU allocator (runtime/memory):
//   output_bytes    its output; parameter_bytes its parameters;
//   optimizer_bytes what the optimizer's first update allocated;
//   stash_bytes     what the forward left allocated besides its output (kept for backward);
//   working_bytes   the most the backward allocated above that;
//   base_bytes      what the job's dataset holds (every rank loads it).
// Layers run together only as far as their parameters, gradients and optimizer state fit
// `memory_budget_bytes`; a model larger than that is profiled in consecutive runs.
// The links: Gloo over loopback between this process and a peer process (as ranks run), or
// a thread of this one: a ping-pong of activations and a 2-rank AllReduce at two sizes,
// fitted to latency + bytes / bandwidth; the CPU of streamed messages at six sizes (sender,
// receiver, the transports' own threads) and of the AllReduce per rank. The cores: how much
// slower a matrix product and GELU run on k threads at once than alone (slowdown).
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
#include "runtime/job/job_spec.h"
#include "runtime/planner/profile.h"

namespace pipetrain::profiler {

struct ProfileOptions {
  std::vector<int> micro_batch_sizes;  // empty: the job's micro_batch_size
  int threads = 1;                     // intra-op threads, as each rank will run
  int warmup = 1;
  int repeats = 5;
  bool measure_links = true;  // false: p2p and allreduce are left at their defaults
  // Layers are profiled together in runs whose parameters, gradients and optimizer state
  // stay within this many bytes (0: a quarter of this machine's memory).
  int64_t memory_budget_bytes = 0;
  // The links are measured between this process and a peer started with this command plus
  // two arguments (the ports of two stores on 127.0.0.1), which must call RunLinkPeer with
  // them; empty: the peer is a thread of this process.
  std::vector<std::string> link_peer_command;
  std::string cache_dir;  // "": no cache
  // Called with a line of progress ("block3 at b=8: forward 12.1 ms ...") as work is done.
  std::function<void(const std::string&)> progress;
};

// InvalidArgument for a job that does not validate or a micro-batch size < 1 or above the
// job's limits; what MakeJobPlan says about the data or a model file.
absl::StatusOr<planner::ModelProfile> ProfileJob(const job::JobSpec& config,
                                                 const ProfileOptions& options);

// The peer side of the link measurements, in a process started by ProfileJob (see
// ProfileOptions::link_peer_command).
absl::Status RunLinkPeer(int p2p_store_port, int replica_store_port);

// The default cache directory: $PIPETRAIN_CACHE_DIR, else $XDG_CACHE_HOME/pipetrain/profiles,
// else $HOME/.cache/pipetrain/profiles ("" when none is set).
std::string DefaultProfileCacheDir();

}  // namespace pipetrain::profiler
