#include "runtime/planner/profile.h"

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
    l.output_bytes = static_cast<int64_t>(std::llround(l.output_bytes * scale));
    l.stash_bytes = static_cast<int64_t>(std::llround(l.stash_bytes * scale));
    l.working_bytes = static_cast<int64_t>(std::llround(l.working_bytes * scale));
  }
  return layers;
}

double AllReduceSeconds(const ClusterProfile& cluster, double bytes, int replicas) {
  if (replicas <= 1) return 0;
  const LinkProfile& link = cluster.allreduce.bytes_per_s > 0 ? cluster.allreduce : cluster.link;
  return 2.0 * (replicas - 1) * (link.latency_s + bytes / replicas / link.bytes_per_s);
}

}  // namespace pipetrain::planner
