#include "runtime/checkpoint/job_checkpoints.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/base/status_macros.h"

namespace pipetrain::checkpoint {

using job::JobPlan;
using job::JobSpec;
using job::StageStart;

namespace {

// `spec` as the resume check compares it: every default applied, the model's image shape
// its effective one, the dtype by its canonical name.
job::JobSpec SameAsWritten(const job::JobSpec& spec) {
  job::JobSpec out = job::WithDefaults(spec);
  if (out.model().image_shape().empty()) {
    for (int64_t d : job::ModelConfigOf(spec).image_shape) out.mutable_model()->add_image_shape(d);
  }
  if (absl::StatusOr<job::Precision> p = job::ParsePrecision(out.dtype()); p.ok()) {
    out.set_dtype(job::PrecisionName(*p));
  }
  return out;
}

// One top-level field of a JobToJson object ("model": its object), as JSON.
std::string FieldJson(const nlohmann::json& spec, const std::string& key) {
  return spec.contains(key) ? spec[key].dump() : std::string("missing");
}

Manifest MakeManifest(const JobSpec& config, const JobPlan& plan, int64_t step,
                      std::vector<LayerFile> files) {
  Manifest m;
  m.step = step;
  m.num_layers = static_cast<int>(plan.layers.size());
  m.job = job::JobToJson(config);
  m.layout = job::PipelineLayoutOf(config);
  m.layout.stages = plan.stages();
  m.layout.stage_layers.clear();  // as planned: balanced ranges included
  for (const model::LayerRange& r : plan.partition)
    m.layout.stage_layers.emplace_back(r.begin, r.end);
  m.global_batch_size =
      int64_t{config.replicas()} * config.microbatches() * config.microbatch_size();
  m.samples_seen = step * m.global_batch_size;
  m.created_unix_ms = absl::ToUnixMillis(absl::Now());
  m.files = std::move(files);
  std::sort(m.files.begin(), m.files.end(),
            [](const auto& a, const auto& b) { return a.layer < b.layer; });
  return m;
}

// "pipetrain: checkpoint before step 50 committed: checkpoints/step-00000050 (12.3 MB in
// 0.41 s)" on stderr.
void ReportCommitted(const JobSpec& config, const Manifest& m, absl::Duration took) {
  int64_t bytes = 0;
  for (const LayerFile& f : m.files) bytes += f.bytes;
  std::fprintf(
      stderr, "pipetrain: checkpoint before step %lld committed: %s (%.1f MB in %.2f s)\n",
      static_cast<long long>(m.step),
      (std::filesystem::path(config.checkpoint().dir()) / StepDirName(m.step)).string().c_str(),
      bytes / 1e6, absl::ToDoubleSeconds(took));
}

// The copies of tied parameters in layer `layer` that are not their group's first member
// (stored only with that member): (their parameter in the layer, the first member).
std::vector<std::pair<int, model::ParameterRef>> AliasesIn(const JobPlan& plan, int layer) {
  std::vector<std::pair<int, model::ParameterRef>> aliases;
  for (const model::TieGroup& group : plan.ties) {
    for (size_t k = 1; k < group.size(); ++k) {
      if (group[k].layer == layer) aliases.emplace_back(group[k].parameter, group.front());
    }
  }
  std::sort(aliases.begin(), aliases.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return aliases;
}

// Writes the stage's layers through `writer` (each tied parameter once, with its group's
// first member); their entries.
absl::StatusOr<std::vector<LayerFile>> WriteStageLayers(CheckpointWriter& writer,
                                                        const JobPlan& plan, int stage,
                                                        const weights::WeightStore& weights) {
  const model::LayerRange range = plan.partition[stage];
  std::vector<LayerState> layers = StageLayerStates(weights);
  std::vector<LayerFile> files;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto aliases = AliasesIn(plan, range.begin + static_cast<int>(i));
    for (auto it = aliases.rbegin(); it != aliases.rend(); ++it) {  // back to front
      LayerState& state = layers[i];
      state.parameters.erase(state.parameters.begin() + it->first);
      if (!state.optimizer.empty()) state.optimizer.erase(state.optimizer.begin() + it->first);
    }
    PT_ASSIGN_OR_RETURN(LayerFile file, writer.WriteLayer(range.begin + static_cast<int>(i),
                                                          SerializeLayerState(layers[i])));
    files.push_back(std::move(file));
  }
  return files;
}

nlohmann::json FilesToJson(const std::vector<LayerFile>& files) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : files) out.push_back({f.layer, f.name, f.bytes, f.sha256});
  return out;
}

absl::StatusOr<std::vector<LayerFile>> FilesFromJson(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return absl::DataLossError("an unreadable entry");
  if (j.contains("error")) return absl::AbortedError(j.value("error", std::string("?")));
  std::vector<LayerFile> files;
  try {
    for (const auto& f : j.at("files")) {
      LayerFile file;
      file.layer = f.at(0).get<int>();
      file.name = f.at(1).get<std::string>();
      file.bytes = f.at(2).get<int64_t>();
      file.sha256 = f.at(3).get<std::string>();
      files.push_back(std::move(file));
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("an unreadable entry: ", e.what()));
  }
  return files;
}

}  // namespace

CheckpointSink::CheckpointSink(const JobSpec& config, const JobPlan& plan)
    : config_(config), plan_(plan) {}

absl::Status CheckpointSink::Deliver(int64_t step, int stage, const weights::WeightStore& weights) {
  CheckpointWriter* writer = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Pending& p = pending_[step];
    if (p.delivered == 0 && p.begun == absl::Time()) p.begun = absl::Now();
    if (p.writer == nullptr && p.error.ok()) {
      auto begun = CheckpointWriter::Begin(config_.checkpoint().dir(), step);
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
  std::vector<LayerFile> files;
  if (writer != nullptr) {
    auto wrote = WriteStageLayers(*writer, plan_, stage, weights);
    if (wrote.ok()) {
      files = *std::move(wrote);
    } else {
      written = wrote.status();
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
    const Manifest m = MakeManifest(config_, plan_, step, p.files);
    result = p.writer->Commit(m, config_.checkpoint().keep());
    if (result.ok()) ReportCommitted(config_, m, absl::Now() - p.begun);
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

std::string CheckpointWriters::Tag() const {
  if (generation == 0 && !survivors) return "";
  return absl::StrCat("gen-", generation, survivors ? "-survivors" : "");
}

SharedCheckpointResult DeliverThroughStore(rendezvous::KeyValueStore& store, const JobSpec& config,
                                           const JobPlan& plan, int64_t step, int stage,
                                           const weights::WeightStore& weights,
                                           const CheckpointWriters& writers) {
  SharedCheckpointResult result;
  const absl::Time begun = absl::Now();
  const std::string tag = writers.Tag();
  const std::string prefix = absl::StrCat("ckpt", tag.empty() ? "" : "-", tag, "/", step, "/");
  auto writer = CheckpointWriter::Join(config.checkpoint().dir(), step, tag);
  absl::StatusOr<std::vector<LayerFile>> files =
      writer.ok() ? WriteStageLayers(**writer, plan, stage, weights)
                  : absl::StatusOr<std::vector<LayerFile>>(writer.status());
  nlohmann::json entry;
  if (files.ok()) {
    entry["files"] = FilesToJson(*files);
  } else {
    result.status = files.status();
    entry["error"] = absl::StrCat("stage ", stage, ": ", files.status().message());
  }
  if (writer.ok()) (*writer)->Release();  // the committer commits or removes it
  if (absl::Status s = store.Set(absl::StrCat(prefix, stage), entry.dump()); !s.ok()) {
    if (result.status.ok()) result.status = s;
    return result;  // not counted in: the checkpoint never completes, `latest` stays
  }
  absl::StatusOr<int64_t> count = store.Add(prefix + "count", 1);
  if (!count.ok()) {
    if (result.status.ok()) result.status = count.status();
    return result;
  }
  if (*count != plan.stages()) return result;
  // Every stage has written (or failed): this rank commits, or removes the directory.
  std::vector<LayerFile> all;
  std::vector<std::string> errors;
  for (int s = 0; s < plan.stages(); ++s) {
    absl::StatusOr<std::string> text = store.Get(absl::StrCat(prefix, s), absl::Seconds(5));
    absl::StatusOr<std::vector<LayerFile>> theirs =
        text.ok() ? FilesFromJson(*text) : absl::StatusOr<std::vector<LayerFile>>(text.status());
    if (!theirs.ok()) {
      errors.push_back(std::string(theirs.status().message()));
      continue;
    }
    all.insert(all.end(), theirs->begin(), theirs->end());
  }
  auto committer = CheckpointWriter::Join(config.checkpoint().dir(), step, tag);
  if (!committer.ok()) {
    errors.push_back(std::string(committer.status().message()));
  } else if (!errors.empty()) {
    (*committer)->Abort();
  } else {
    const Manifest m = MakeManifest(config, plan, step, std::move(all));
    absl::Status committed = (*committer)->Commit(m, config.checkpoint().keep());
    if (committed.ok()) {
      ReportCommitted(config, m, absl::Now() - begun);
      result.committed = (std::filesystem::absolute(config.checkpoint().dir()) / StepDirName(step))
                             .lexically_normal()
                             .string();
    } else {
      errors.push_back(std::string(committed.message()));
    }
  }
  if (!errors.empty()) {
    result.status = absl::UnavailableError(absl::StrCat(
        "the checkpoint before step ", step, " was not committed: ", absl::StrJoin(errors, "; ")));
  }
  for (int s = 0; s < plan.stages(); ++s) (void)store.Delete(absl::StrCat(prefix, s));
  (void)store.Delete(prefix + "count");
  return result;
}

absl::StatusOr<std::optional<FoundCheckpoint>> FindResumePointShared(
    rendezvous::KeyValueStore& store, const JobSpec& config, const JobPlan& plan, int rank,
    absl::Duration timeout) {
  if (config.resume_from().empty()) return std::nullopt;
  constexpr char kKey[] = "resume/checkpoint";
  if (rank == 0) {
    auto found = FindResumePoint(config, plan);
    nlohmann::json published;
    if (found.ok()) {
      published["dir"] = (*found)->dir;
    } else {
      published["error"] = std::string(found.status().message());
    }
    if (absl::Status s = store.Set(kKey, published.dump()); !s.ok() && found.ok()) return s;
    return found;
  }
  absl::StatusOr<std::string> text = store.Get(kKey, timeout);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("resume_from: waiting for rank 0 to find the checkpoint: ",
                                     text.status().message()));
  }
  const nlohmann::json published = nlohmann::json::parse(*text, nullptr, false);
  if (!published.is_object() || !published.contains("dir")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_from: rank 0 found no checkpoint to resume from: ",
        published.is_object() ? published.value("error", std::string("?")) : std::string("?")));
  }
  auto opened = OpenCheckpoint(published["dir"].get<std::string>());
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("resume_from: ", opened.status().message()));
  }
  return std::optional<FoundCheckpoint>(*std::move(opened));
}

absl::StatusOr<std::optional<FoundCheckpoint>> FindResumePoint(const JobSpec& c,
                                                               const JobPlan& plan) {
  if (c.resume_from().empty()) return std::nullopt;
  const std::string path = c.resume_from() == "latest" ? c.checkpoint().dir() : c.resume_from();
  auto found = FindCheckpoint(path);
  if (!found.ok()) {
    return absl::Status(found.status().code(),
                        absl::StrCat("resume_from: ", found.status().message()));
  }
  const Manifest& m = found->manifest;
  std::vector<std::string> errors;
  const absl::StatusOr<job::JobSpec> written = job::JobFromJson(m.job);
  if (!written.ok()) {
    errors.push_back(absl::StrCat("the checkpoint's job: ", written.status().message()));
  } else {
    const job::JobSpec was = SameAsWritten(*written), now = SameAsWritten(c);
    // Compared as JobToJson writes them: every default set, fields in field order.
    const nlohmann::json was_json = nlohmann::json::parse(job::JobToJson(was));
    const nlohmann::json now_json = nlohmann::json::parse(job::JobToJson(now));
    for (const char* key : {"model", "data", "dtype", "seed"}) {
      const std::string before = FieldJson(was_json, key), after = FieldJson(now_json, key);
      if (before != after) {
        errors.push_back(
            absl::StrCat(key, " differs: the checkpoint's is ", before, ", this job's ", after));
      }
    }
    if (was.optimizer().name() != now.optimizer().name()) {
      errors.push_back(absl::StrCat("optimizer.name differs (the checkpoint's state is for ",
                                    was.optimizer().name(), ")"));
    }
  }
  const int64_t batch = int64_t{c.replicas()} * c.microbatches() * c.microbatch_size();
  if (m.global_batch_size != batch) {
    errors.push_back(absl::StrCat(
        "the global batch (replicas x microbatches x microbatch_size) "
        "is ",
        batch, "; the checkpoint's is ", m.global_batch_size, " (the data order would differ)"));
  }
  if (m.num_layers != static_cast<int>(plan.layers.size())) {
    errors.push_back(absl::StrCat("the model has ", plan.layers.size(), " layers; the checkpoint ",
                                  m.num_layers));
  }
  if (m.step >= c.steps()) {
    errors.push_back(absl::StrCat("the checkpoint is of step ", m.step, "; the job has ", c.steps(),
                                  " steps: nothing is left to run"));
  }
  if (!errors.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("resume_from ", found->dir, ": ", absl::StrJoin(errors, "; ")));
  }
  return std::optional<FoundCheckpoint>(*std::move(found));
}

namespace {

// Layer `layer`'s file of the checkpoint `found`, read and parsed.
absl::StatusOr<LayerState> ParseLayer(const FoundCheckpoint& found, int layer) {
  auto bytes = ReadLayer(found, layer);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("resume_from: ", bytes.status().message()));
  }
  auto state = ParseLayerState(*bytes);
  if (!state.ok()) {
    return absl::Status(
        state.status().code(),
        absl::StrCat("resume_from: layer ", layer, " (",
                     (std::filesystem::path(found.dir) / LayerFileName(layer)).string(),
                     "): ", state.status().message()));
  }
  return state;
}

}  // namespace

absl::StatusOr<StageStart> StageStartFrom(const std::optional<FoundCheckpoint>& found,
                                          const JobPlan& plan, int stage) {
  StageStart start;
  if (!found) return start;
  start.first_step = found->manifest.step;
  for (const model::LayerRange& r : job::RankLayers(plan, stage)) {
    for (int layer = r.begin; layer < r.end; ++layer) {
      auto state = ParseLayer(*found, layer);
      if (!state.ok()) return state.status();
      // Tied copies stored with their group's first member: loaded from there.
      for (const auto& [parameter, first] : AliasesIn(plan, layer)) {
        PT_ASSIGN_OR_RETURN(LayerState canonical, ParseLayer(*found, first.layer));
        if (first.parameter >= static_cast<int>(canonical.parameters.size()) ||
            parameter > static_cast<int>(state->parameters.size()) ||
            state->optimizer.size() != state->parameters.size()) {
          return absl::DataLossError(absl::StrCat("resume_from: layer ", first.layer,
                                                  " holds no tied parameter ", first.parameter));
        }
        // ParseLayerState gives every parameter its optimizer state (empty before any step).
        state->parameters.insert(state->parameters.begin() + parameter,
                                 canonical.parameters[first.parameter]);
        state->optimizer.insert(state->optimizer.begin() + parameter,
                                canonical.optimizer[first.parameter]);
      }
      start.layers.push_back(*std::move(state));
    }
  }
  return start;
}

}  // namespace pipetrain::checkpoint
