// The simulations' shared parts (predict_internal.h): one micro-batch's memory on a stage, the
// speed of ranks sharing cores, the step time.
#include <algorithm>

#include "runtime/planner/predict_internal.h"

namespace pipetrain::planner::internal {

// What a received message of `bytes` occupies (profile.h, inline_buffer_bytes).
int64_t ReceivedBytes(const ModelProfile& profile, int64_t bytes) {
  const int64_t inline_bytes = profile.inline_buffer_bytes;
  if (inline_bytes > 0 && 2 * bytes >= inline_bytes && bytes <= inline_bytes) {
    return inline_bytes;  // its header's few bytes aside
  }
  return bytes;
}

// One micro-batch's memory on the stage of layers [begin, end). Its forward keeps the
// received input and, per layer, what the layer stashes and its output; a run of recomputed
// layers keeps only the run's output. Its backward goes from the last layer to the first, a
// recomputed run as one piece: while a piece runs, the stage still holds what the micro-batch
// kept up to the piece's last layer, the piece's working memory (the profile's: its own
// allocations, the input's gradient included), for a run everything the recomputation
// stashes again, and the parameter gradients: in the step's first backward those of the
// pieces done so far and this one, later all of them.
MicroBatchBytes MicroBatchMemory(const ModelProfile& profile,
                                 const std::vector<LayerProfile>& layers, const Layout& layout,
                                 int begin, int end) {
  // kept_through[i]: what the micro-batch keeps from the stage's input through layer begin+i.
  std::vector<int64_t> kept_through(end - begin);
  int64_t kept = begin > 0 ? ReceivedBytes(profile, layers[begin - 1].output_bytes) : 0;
  int64_t gradient = 0;
  for (int l = begin; l < end; ++l) {
    const LayerProfile& layer = layers[l];
    if (!layout.recomputes(l)) {
      kept += layer.stash_bytes + layer.output_bytes;
    } else if (l + 1 == end || !layout.recomputes(l + 1)) {
      kept += layer.output_bytes;  // the run's output stays for the next layer
    }
    kept_through[l - begin] = kept;
    gradient += layer.parameter_bytes;
  }
  MicroBatchBytes m;
  m.kept = kept;
  for (int l = begin; l < end; ++l) {
    if (layout.recomputes(l)) m.recomputed += layers[l].stash_bytes + layers[l].output_bytes;
  }
  int64_t gradient_so_far = 0;
  for (int last = end - 1; last >= begin;) {
    int first = last;
    while (layout.recomputes(last) && first > begin && layout.recomputes(first - 1)) --first;
    int64_t working = 0, recomputed = 0;
    // The AllReduce's copies of the pieces done before this one (when it overlaps).
    const int64_t copied = gradient_so_far;
    for (int l = first; l <= last; ++l) {
      working = std::max(working, layers[l].working_bytes);
      gradient_so_far += layers[l].parameter_bytes;
      if (layout.recomputes(l)) recomputed += layers[l].stash_bytes + layers[l].output_bytes;
    }
    const int64_t held = kept_through[last - begin] + recomputed + working;
    m.backward_first = std::max(m.backward_first, held + gradient_so_far);
    m.backward_later = std::max(m.backward_later, held + gradient);
    m.overlapped_first = std::max(m.overlapped_first, held + gradient_so_far + copied);
    m.overlapped_later = std::max(m.overlapped_later, held + gradient + copied);
    last = first - 1;
  }
  return m;
}

double SharedCoreRate(const ModelProfile& profile, const ClusterProfile& cluster, int computing,
                      int replicas) {
  if (cluster.shared_cores <= 0 || computing <= 0) return 1.0;
  const int ranks = computing * replicas;
  const int running = std::min(ranks, cluster.shared_cores);
  double rate = static_cast<double>(running) / ranks;
  if (!profile.slowdown.empty()) {
    rate /= profile.slowdown[std::min<size_t>(running, profile.slowdown.size()) - 1];
  }
  return rate;
}

absl::Status SetStepTime(const ModelProfile& profile, const Layout& layout,
                         const std::vector<double>& step_end, Prediction& prediction) {
  if (step_end.size() != kSimulatedSteps) {
    return absl::InternalError("the simulation did not run every step");
  }
  prediction.step_time_s = (step_end[kSimulatedSteps - 2] - step_end[1]) / (kSimulatedSteps - 3);
  prediction.samples_per_s = layout.global_batch() / prediction.step_time_s;
  prediction.tokens_per_s =
      prediction.samples_per_s * static_cast<double>(profile.tokens_per_sample);
  return absl::OkStatus();
}

}  // namespace pipetrain::planner::internal
