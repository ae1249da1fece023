#include "coordinator/job_traffic.h"

#include <numeric>
#include <utility>

#include "runtime/planner/host_placement.h"

namespace pipetrain::coordinator {

model::ModelConfig ModelSizedByData(const job::JobSpec& c) {
  model::ModelConfig m = job::ModelConfigOf(c);
  m.float64 = job::PrecisionOf(c) == job::Precision::kFloat64;
  const std::string kind = job::DataKindOf(c);
  if (kind != "classification") {
    m.vocab_size = c.data().vocab() > 0 ? c.data().vocab() : (kind == "bytes" ? 256 : 65536);
    m.seq_len = c.data().seq_len();
  }
  return m;
}

std::optional<std::vector<model::LayerRange>> StageRanges(
    const model::PipelineLayout& layout, const std::vector<model::LayerInfo>& layers) {
  std::vector<model::LayerRange> ranges;
  for (const auto& [begin, end] : layout.stage_layers) ranges.push_back({begin, end});
  if (!ranges.empty()) return ranges;
  std::vector<double> counts;
  for (const model::LayerInfo& l : layers) counts.push_back(static_cast<double>(l.num_parameters));
  absl::StatusOr<std::vector<model::LayerRange>> balanced =
      model::BalancedPartition(counts, layout.stages);
  if (!balanced.ok()) return std::nullopt;
  return *std::move(balanced);
}

std::optional<planner::ModelProfile> TrafficProfile(const job::JobSpec& c) {
  const model::ModelConfig m = ModelSizedByData(c);
  absl::StatusOr<std::vector<model::LayerInfo>> layers = model::BuiltinLayers(m);
  if (!layers.ok()) return std::nullopt;
  const int weight_bytes = job::PrecisionOf(c) == job::Precision::kFloat64 ? 8 : 4;
  const int activation_bytes = job::PrecisionOf(c) == job::Precision::kBFloat16 ? 2 : weight_bytes;
  std::vector<int64_t> shape = {c.microbatch_size()};
  if (job::DataKindOf(c) != "classification") {
    shape.push_back(m.seq_len);
  } else if (m.name == "cnn" || m.name == "vgg") {
    shape.insert(shape.end(), m.image_shape.begin(), m.image_shape.end());
  } else {
    shape.push_back(m.input_dim);
  }
  planner::ModelProfile profile;
  profile.model = m.name;
  planner::MicroBatchProfile size;
  size.micro_batch_size = c.microbatch_size();
  for (int i = 0; i < static_cast<int>(layers->size()); ++i) {
    absl::StatusOr<std::vector<int64_t>> out = model::BuiltinLayerOutputShape(m, i, shape);
    if (!out.ok()) return std::nullopt;
    shape = *std::move(out);
    planner::LayerProfile layer;
    layer.name = (*layers)[i].name;
    layer.output_bytes = activation_bytes * std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                                            std::multiplies<int64_t>());
    layer.parameter_bytes = weight_bytes * (*layers)[i].num_parameters;
    size.layers.push_back(std::move(layer));
  }
  profile.sizes.push_back(std::move(size));
  profile.p2p = kWithinHostLink;
  profile.allreduce = kWithinHostLink;
  return profile;
}

HostPlacer MakeHostPlacer(const job::JobSpec& c, const planner::HostLinks& between) {
  // Nothing is computed until a job fits and its free workers span hosts (the queue is
  // planned at every registration).
  return [&c, between](const std::vector<int>& free_per_host) -> std::vector<int> {
    std::optional<planner::ModelProfile> profile = TrafficProfile(c);
    if (!profile) return {};
    planner::Layout layout;
    layout.schedule = job::ScheduleOf(c);
    layout.pipeline = job::PipelineLayoutOf(c);
    std::vector<model::LayerInfo> layers;
    for (const planner::LayerProfile& l : profile->sizes.front().layers) {
      layers.push_back({l.name, l.parameter_bytes, {}});  // balanced by bytes as by counts
    }
    std::optional<std::vector<model::LayerRange>> ranges = StageRanges(layout.pipeline, layers);
    if (!ranges) return {};
    std::vector<std::pair<int, int>> stage_layers;
    for (const model::LayerRange& r : *ranges) stage_layers.emplace_back(r.begin, r.end);
    layout.SetStageLayers(std::move(stage_layers));
    layout.overlap_allreduce = c.overlap_allreduce();
    layout.bucket_bytes = int64_t{c.bucket_kib()} * 1024;
    planner::ClusterProfile cluster;
    cluster.link = kWithinHostLink;
    cluster.allreduce = kWithinHostLink;
    cluster.between_hosts = between.measured() ? between.p2p : kBetweenHostsLink;
    cluster.between_hosts_allreduce = between.measured() ? between.allreduce : kBetweenHostsLink;
    cluster.host_workers = free_per_host;
    cluster.workers = std::accumulate(free_per_host.begin(), free_per_host.end(), 0);
    absl::StatusOr<std::vector<planner::HostPlacement>> placements =
        planner::RankHostPlacements(*profile, cluster, layout);
    if (!placements.ok()) return {};
    return placements->front().rank_hosts;
  };
}

}  // namespace pipetrain::coordinator
