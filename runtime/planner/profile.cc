#include "runtime/planner/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace pipetrain::planner {

std::vector<LayerProfile> LayersAt(const ModelProfile& profile, int b) {
  const MicroBatchProfile* nearest = &profile.sizes.front();
  for (const MicroBatchProfile& size : profile.sizes) {
    if (size.micro_batch_size == b) return size.layers;
    if (std::abs(size.micro_batch_size - b) < std::abs(nearest->micro_batch_size - b)) {
      nearest = &size;
    }
  }
  const double scale = static_cast<double>(b) / nearest->micro_batch_size;
  std::vector<LayerProfile> layers = nearest->layers;
  for (LayerProfile& l : layers) {
    l.forward_s *= scale;
    l.backward_s *= scale;
    if (l.weight_gradient_s > 0) l.weight_gradient_s *= scale;
    l.output_bytes = static_cast<int64_t>(std::llround(l.output_bytes * scale));
    l.stash_bytes = static_cast<int64_t>(std::llround(l.stash_bytes * scale));
    l.working_bytes = static_cast<int64_t>(std::llround(l.working_bytes * scale));
  }
  return layers;
}

MessageCost MessageCostAt(const std::vector<MessageCost>& costs, double bytes) {
  MessageCost out;
  out.bytes = static_cast<int64_t>(bytes);
  if (costs.empty()) return out;
  if (costs.size() == 1) {
    out.send_s = costs[0].send_s;
    out.recv_s = costs[0].recv_s;
    out.background_s = costs[0].background_s;
    out.latency_s = costs[0].latency_s;
    return out;
  }
  size_t hi = 1;
  while (hi + 1 < costs.size() && costs[hi].bytes < bytes) ++hi;
  const MessageCost& a = costs[hi - 1];
  const MessageCost& b = costs[hi];
  const double span = static_cast<double>(b.bytes - a.bytes);
  const double f = span > 0 ? std::max(0.0, bytes - a.bytes) / span : 0.0;
  const auto lerp = [f](double x, double y) { return std::max(0.0, x + f * (y - x)); };
  out.send_s = lerp(a.send_s, b.send_s);
  out.recv_s = lerp(a.recv_s, b.recv_s);
  out.background_s = lerp(a.background_s, b.background_s);
  out.latency_s = a.latency_s > 0 && b.latency_s > 0 ? lerp(a.latency_s, b.latency_s) : 0;
  return out;
}

double AllReduceSeconds(const ClusterProfile& cluster, double bytes, int replicas, int calls,
                        bool spans_hosts) {
  if (replicas <= 1) return 0;
  const LinkProfile& within = cluster.allreduce.bytes_per_s > 0 ? cluster.allreduce : cluster.link;
  const LinkProfile& link = !spans_hosts ? within
                            : cluster.between_hosts_allreduce.bytes_per_s > 0
                                ? cluster.between_hosts_allreduce
                            : cluster.between_hosts.bytes_per_s > 0 ? cluster.between_hosts
                                                                    : within;
  return 2.0 * (replicas - 1) *
         (std::max(1, calls) * link.latency_s + bytes / replicas / link.bytes_per_s);
}

double AllReduceCpuSeconds(const ModelProfile& profile, double bytes, int replicas, int calls) {
  const LinkProfile& cpu = profile.allreduce_cpu;
  if (replicas <= 1 || !(cpu.bytes_per_s > 0)) return 0;
  return std::max(1, calls) * cpu.latency_s +
         2.0 * (replicas - 1) / replicas * bytes / cpu.bytes_per_s;
}

}  // namespace pipetrain::planner
