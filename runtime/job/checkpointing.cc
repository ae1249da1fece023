#include "runtime/job/checkpointing.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::job {

CheckpointSink::CheckpointSink(const JobConfig& config, const JobPlan& plan)
    : config_(config), plan_(plan) {}

absl::Status CheckpointSink::Deliver(int64_t step, int stage, const weights::WeightStore& weights) {
  const model::LayerRange range = plan_.partition[stage];
  checkpoint::CheckpointWriter* writer = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Pending& p = pending_[step];
    if (p.writer == nullptr && p.error.ok()) {
      auto begun = checkpoint::CheckpointWriter::Begin(config_.checkpoint.dir, step);
      if (begun.ok()) {
        p.writer = *std::move(begun);
      } else {
        p.error = begun.status();
      }
    }
    writer = p.writer.get();
  }
  // Serialize and write outside the lock: the stages write their own layers concurrently.
  absl::Status written;
  std::vector<checkpoint::LayerFile> files;
  if (writer != nullptr) {
    const std::vector<checkpoint::LayerState> layers = checkpoint::StageLayerStates(weights);
    for (size_t i = 0; i < layers.size() && written.ok(); ++i) {
      auto file = writer->WriteLayer(range.begin + static_cast<int>(i),
                                     checkpoint::SerializeLayerState(layers[i]));
      if (file.ok()) {
        files.push_back(*file);
      } else {
        written = file.status();
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  Pending& p = pending_[step];
  if (!written.ok() && p.error.ok()) p.error = written;
  p.files.insert(p.files.end(), files.begin(), files.end());
  if (++p.delivered < plan_.stages()) return p.error;
  // The last stage: commit, or give up on this checkpoint.
  absl::Status result = p.error;
  if (result.ok()) {
    checkpoint::Manifest m;
    m.step = step;
    m.num_layers = static_cast<int>(plan_.layers.size());
    m.job = JobConfigToJson(config_);
    m.layout.stages = plan_.stages();
    m.layout.replicas = config_.replicas;
    m.layout.micro_batches = config_.micro_batches;
    m.layout.micro_batch_size = config_.micro_batch_size;
    for (const model::LayerRange& r : plan_.partition) m.layout.stage_layers.emplace_back(r.begin, r.end);
    m.global_batch_size = int64_t{config_.replicas} * config_.micro_batches * config_.micro_batch_size;
    m.samples_seen = step * m.global_batch_size;
    m.created_unix_ms = absl::ToUnixMillis(absl::Now());
    m.files = p.files;
    std::sort(m.files.begin(), m.files.end(),
              [](const auto& a, const auto& b) { return a.layer < b.layer; });
    result = p.writer->Commit(m, config_.checkpoint.keep);
  } else if (p.writer != nullptr) {
    p.writer->Abort();
  }
  result.ok() ? ++committed_ : ++failed_;
  pending_.erase(step);
  return result;
}

int CheckpointSink::committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_;
}

int CheckpointSink::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

absl::StatusOr<std::optional<checkpoint::FoundCheckpoint>> FindResumePoint(const JobConfig& c,
                                                                           const JobPlan& plan) {
  if (c.resume_from.empty()) return std::nullopt;
  const std::string path = c.resume_from == "latest" ? c.checkpoint.dir : c.resume_from;
  auto found = checkpoint::FindCheckpoint(path);
  if (!found.ok()) {
    return absl::Status(found.status().code(),
                        absl::StrCat("resume_from: ", found.status().message()));
  }
  const checkpoint::Manifest& m = found->manifest;
  std::vector<std::string> errors;
  const nlohmann::json written = nlohmann::json::parse(m.job, nullptr, false);
  const nlohmann::json now = nlohmann::json::parse(JobConfigToJson(c));
  for (const char* key : {"model", "data", "dtype", "seed"}) {
    if (!written.is_object() || !written.contains(key) || written[key] != now[key]) {
      errors.push_back(absl::StrCat(key, " differs: the checkpoint's is ",
                                    written.is_object() && written.contains(key)
                                        ? written[key].dump()
                                        : std::string("missing"),
                                    ", this job's ", now[key].dump()));
    }
  }
  if (!written.is_object() || !written.contains("optimizer") ||
      written["optimizer"].value("name", "") != c.optimizer.name) {
    errors.push_back(absl::StrCat("optimizer.name differs (the checkpoint's state is for ",
                                  written.is_object() && written.contains("optimizer")
                                      ? written["optimizer"].value("name", "?")
                                      : std::string("?"),
                                  ")"));
  }
  const int64_t batch = int64_t{c.replicas} * c.micro_batches * c.micro_batch_size;
  if (m.global_batch_size != batch) {
    errors.push_back(absl::StrCat("the global batch (replicas x microbatches x microbatch_size) "
                                  "is ", batch, "; the checkpoint's is ", m.global_batch_size,
                                  " (the data order would differ)"));
  }
  if (m.num_layers != static_cast<int>(plan.layers.size())) {
    errors.push_back(absl::StrCat("the model has ", plan.layers.size(),
                                  " layers; the checkpoint ", m.num_layers));
  }
  if (m.step >= c.steps) {
    errors.push_back(absl::StrCat("the checkpoint is of step ", m.step, "; the job has ",
                                  c.steps, " steps: nothing is left to run"));
  }
  if (!errors.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("resume_from ", found->dir, ": ",
                                                      absl::StrJoin(errors, "; ")));
  }
  return std::optional<checkpoint::FoundCheckpoint>(*std::move(found));
}

absl::StatusOr<StageStart> StageStartFrom(const std::optional<checkpoint::FoundCheckpoint>& found,
                                          const JobPlan& plan, int stage) {
  StageStart start;
  if (!found) return start;
  start.first_step = found->manifest.step;
  const model::LayerRange r = plan.partition[stage];
  for (int layer = r.begin; layer < r.end; ++layer) {
    auto bytes = checkpoint::ReadLayer(*found, layer);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(), absl::StrCat("resume_from: ", bytes.status().message()));
    }
    auto state = checkpoint::ParseLayerState(*bytes);
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("resume_from: layer ", layer, ": ", state.status().message()));
    }
    start.layers.push_back(*std::move(state));
  }
  return start;
}

}  // namespace pipetrain::job
