// What the planners know of a model and of the machines it may run on: per layer, costs
// measured (runtime/profiler) or given for one micro-batch of one size; per link, a latency
// and a bandwidth. Plain data, no LibTorch: planners are pure functions of these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipetrain::planner {

// Per layer, for one micro-batch of its profile's micro-batch size.
struct LayerProfile {
  std::string name;
  double forward_s = 0;         // one micro-batch (a recomputation costs the same again)
  double backward_s = 0;        // one micro-batch
  double optimizer_s = 0;       // one update of its parameters (once per step)
  int64_t output_bytes = 0;     // the activation it hands to the next layer (and its gradient back)
  int64_t parameter_bytes = 0;  // one version of its parameters
  int64_t optimizer_bytes = 0;  // the optimizer's state for them (AdamW: 2 x parameter_bytes)
  int64_t stash_bytes = 0;      // what it keeps from a forward for its backward (output excluded)
  int64_t working_bytes = 0;    // the most its backward allocates above that, freed at its end
  // The weight-gradient part (W) of a split backward (model/weight_gradients.h: what the
  // layer defers), one micro-batch; its I is the rest of backward_s. -1: not measured.
  double weight_gradient_s = -1;
};

struct LinkProfile {
  double latency_s = 0;    // per message
  double bytes_per_s = 1;  // > 0

  // Seconds to move `bytes` once.
  double Seconds(double bytes) const { return latency_s + bytes / bytes_per_s; }
};

// The links between ranks on two different hosts, as measured (runtime/profiler:
// ProfileGlooLinks between two addresses).
struct HostLinks {
  LinkProfile p2p{0, 0};        // bytes_per_s 0: not measured
  LinkProfile allreduce{0, 0};  // a ring AllReduce of 2 ranks, one on each host

  bool measured() const { return p2p.bytes_per_s > 0; }
};

// One message of `bytes` between ranks that compute in between, as neighbouring stages do:
// the CPU of the sending thread's Send, of the receiving thread's Recv once it has arrived,
// and of the transport's own threads at both ends (event loops, delivery), and the time from
// the end of the Send to the return of a Recv that waits for it.
struct MessageCost {
  int64_t bytes = 0;
  double send_s = 0;
  double recv_s = 0;
  double background_s = 0;
  double latency_s = 0;  // 0: not measured (the link's latency + bytes / bandwidth instead)
};

// A model profiled at one micro-batch size; one entry per size measured.
struct MicroBatchProfile {
  int micro_batch_size = 1;
  std::vector<LayerProfile> layers;
};

// Everything measured about one model on one device: the planners' input.
struct ModelProfile {
  std::string model;  // what was profiled, in words (name and sizes)
  std::string device = "cpu";
  std::string dtype = "float32";
  int threads = 1;                       // intra-op threads the measurements ran with
  int64_t tokens_per_sample = 1;         // gpt: the sequence length; 1 for other models
  std::vector<MicroBatchProfile> sizes;  // ascending micro-batch size, at least one
  int64_t base_bytes = 0;            // tensors every rank holds besides its layers' (the dataset)
  LinkProfile p2p;                   // one activation or gradient between two ranks
  int64_t receive_buffer_bytes = 0;  // kept posted by the transport per stream it receives
  // A received message of at most half this size is copied out; a larger one up to this size
  // stays in its receive buffer (this size + the header); 0: every message is its own size.
  int64_t inline_buffer_bytes = 0;
  LinkProfile allreduce;  // a ring AllReduce of 2 ranks: latency + bytes / bandwidth
  // The same two between ranks on different hosts, when measured (pipetrain profile-link);
  // the planners take them as ClusterProfile::between_hosts*.
  HostLinks between_hosts;
  // The CPU one rank spends on that AllReduce: fixed + bytes / rate (zero: none counted).
  LinkProfile allreduce_cpu{0, 0};
  // Ascending bytes; between two sizes the costs are interpolated, beyond the largest they
  // grow as between the last two. Empty: messages cost no CPU.
  std::vector<MessageCost> message_costs;
  // slowdown[k - 1]: how much longer the same computation takes when k ranks compute at once
  // on this machine's cores (1 for k = 1; shared caches, memory bandwidth, SMT siblings).
  // Empty: no slowdown.
  std::vector<double> slowdown;
};

struct ClusterProfile {
  int workers = 1;           // identical workers, one rank each
  LinkProfile link;          // between any two of them (activations, gradients)
  int64_t memory_bytes = 0;  // each worker's (0: not limited)
  // A ring AllReduce among w ranks takes 2 (w - 1) steps of latency + (bytes / w) / bandwidth
  // on this link; bytes_per_s 0: on `link`.
  LinkProfile allreduce{0, 0};
  // CPU cores all workers share (processes on one machine); 0: each worker computes on
  // hardware of its own. When more ranks compute at once than there are cores, they share
  // the cores equally (ranks run one intra-op thread each).
  int shared_cores = 0;
  // Hosts (docs/planning.md "Hosts"): how many of the workers each host has, in the order
  // their indices name them (empty: every worker on one host). Ranks on different hosts talk
  // over `between_hosts` (a message; bytes_per_s 0: as within a host), and an AllReduce ring
  // that spans hosts runs at `between_hosts_allreduce` (bytes_per_s 0: as `between_hosts`).
  std::vector<int> host_workers;
  LinkProfile between_hosts{0, 0};
  LinkProfile between_hosts_allreduce{0, 0};

  int hosts() const { return host_workers.empty() ? 1 : static_cast<int>(host_workers.size()); }
};

// The CPU costs of one message of `bytes`: interpolated between the two measured sizes around
// it, extrapolated beyond the last two (never below zero); all zero when none was measured.
MessageCost MessageCostAt(const std::vector<MessageCost>& costs, double bytes);

// Seconds of a ring AllReduce of `bytes` among `replicas` ranks on `cluster` (0 for one),
// made in `calls` collectives (buckets) of equal size: each pays the latency.
// With `spans_hosts` the ring runs at the cluster's between-hosts AllReduce link (its
// slowest link sets every step's pace).
double AllReduceSeconds(const ClusterProfile& cluster, double bytes, int replicas, int calls = 1,
                        bool spans_hosts = false);
// The CPU one rank spends on that AllReduce (the profile's allreduce_cpu, measured for 2
// ranks: fixed per call + the 2 (w - 1) / w share of the bytes at its rate); 0 when the
// profile has none.
double AllReduceCpuSeconds(const ModelProfile& profile, double bytes, int replicas, int calls = 1);

// The per-layer costs at micro-batch size `b`: the profile of that size when measured, else
// the nearest measured size's times and activation bytes scaled by b / b0 (parameter and
// optimizer bytes do not depend on b). REQUIRES: !profile.sizes.empty().
std::vector<LayerProfile> LayersAt(const ModelProfile& profile, int b);

}  // namespace pipetrain::planner
