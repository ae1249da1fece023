#include "runtime/job/launch/stage_run.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/process_memory.h"
#include "runtime/base/rank_layout.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/checkpoint/job_checkpoints.h"
#include "runtime/job/device.h"
#include "runtime/job/plan.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/transport/for_device.h"
#include "runtime/weights/tensor_list_file.h"

namespace pipetrain::job {
namespace {

namespace fs = std::filesystem;

// ---- stage outcome files: <dir>/stage<S>.json (measurements), <dir>/stage<S>.pt (weights)

nlohmann::json StatsToJson(const executor::StageStats& st) {
  nlohmann::json j;
  j["peak_stashed_microbatches"] = st.peak_stashed_microbatches;
  j["peak_weight_versions"] = st.peak_weight_versions;
  j["compute_s"] = st.compute_s;
  j["wait_s"] = st.wait_s;
  j["allreduce_s"] = st.allreduce_s;
  j["skipped_steps"] = st.skipped_steps;
  auto& records = j["records"] = nlohmann::json::array();
  for (const auto& r : st.records) {
    records.push_back({static_cast<int>(r.action.kind), r.action.index, r.start_s, r.end_s,
                       r.wait_s, r.version, r.action.stage});
  }
  auto& allreduces = j["allreduces"] = nlohmann::json::array();
  for (const auto& a : st.allreduces) allreduces.push_back({a.step, a.bucket, a.start_s, a.end_s});
  auto& steps = j["steps"] = nlohmann::json::array();
  for (const auto& s : st.steps) {
    steps.push_back({s.step, s.end_s, s.mean_loss ? nlohmann::json(*s.mean_loss) : nullptr,
                     s.last_backward_end_s, s.commands_after,
                     s.grad_norm ? nlohmann::json(*s.grad_norm) : nullptr,
                     s.eval ? nlohmann::json({s.eval->loss, s.eval->accuracy}) : nullptr});
  }
  return j;
}

executor::StageStats StatsFromJson(const nlohmann::json& j) {
  executor::StageStats st;
  st.peak_stashed_microbatches = j.at("peak_stashed_microbatches");
  st.peak_weight_versions = j.at("peak_weight_versions");
  st.compute_s = j.at("compute_s");
  st.wait_s = j.at("wait_s");
  st.allreduce_s = j.at("allreduce_s");
  st.skipped_steps = j.value("skipped_steps", int64_t{0});
  for (const auto& r : j.at("records")) {
    executor::ActionRecord rec;
    rec.action = {static_cast<schedule::ActionKind>(r[0].get<int>()), r[1].get<int64_t>(),
                  r.size() > 6 ? r[6].get<int>() : schedule::kOwnStage};
    rec.start_s = r[2];
    rec.end_s = r[3];
    rec.wait_s = r[4];
    rec.version = r[5];
    st.records.push_back(rec);
  }
  for (const auto& a : j.at("allreduces")) {
    st.allreduces.push_back(
        {a[0].get<int64_t>(), a[1].get<int>(), a[2].get<double>(), a[3].get<double>()});
  }
  for (const auto& s : j.at("steps")) {
    executor::StepRecord step;
    step.step = s[0];
    step.end_s = s[1];
    if (!s[2].is_null()) step.mean_loss = s[2].get<double>();
    step.last_backward_end_s = s[3];
    if (s.size() > 4) step.commands_after = s[4];
    if (s.size() > 5 && !s[5].is_null()) step.grad_norm = s[5].get<double>();
    if (s.size() > 6 && !s[6].is_null()) {
      step.eval = executor::EvalRecord{s[6][0].get<double>(), s[6][1].get<double>()};
    }
    st.steps.push_back(step);
  }
  return st;
}

// The first rank of a job (of one generation) to fail publishes its error in the store
// while its transport is still up; a rank that fails later, most likely on a connection the
// first one closed, keeps its own error but leads with the first's, and is marked with
// kFailedAfterPeerPayload (the rank that failed first).
absl::Status AttributeFailure(rendezvous::KeyValueStore& store, int rank, int stages,
                              const absl::Status& own) {
  const auto name = [stages](int r) {
    return absl::StrCat("rank ", r, " (stage ", r % stages, ")");
  };
  absl::StatusOr<int64_t> order = store.Add("failed/count", 1);
  if (!order.ok()) return own;
  if (*order == 1) {
    nlohmann::json first = {{"rank", rank}, {"error", std::string(own.message()).substr(0, 2048)}};
    (void)store.Set("failed/first", first.dump());
    return own;
  }
  absl::StatusOr<std::string> text = store.Get("failed/first", absl::Seconds(2));
  if (!text.ok()) return own;
  const nlohmann::json first = nlohmann::json::parse(*text, nullptr, false);
  if (!first.is_object() || !first.contains("rank") || !first["rank"].is_number_integer() ||
      first["rank"].get<int>() == rank) {
    return own;
  }
  const int first_rank = first["rank"].get<int>();
  absl::Status attributed(own.code(), absl::StrCat(name(first_rank), " failed first: ",
                                                   first.value("error", std::string("?")),
                                                   " (here: ", own.message(), ")"));
  attributed.SetPayload(kFailedAfterPeerPayload, absl::Cord(std::to_string(first_rank)));
  return attributed;
}

fs::path OutcomePath(const std::string& dir, int stage, const char* ext) {
  return fs::path(dir) / absl::StrCat("stage", stage, ext);
}

}  // namespace

absl::StatusOr<StageOutcome> RunStage(const JobSpec& c, int rank,
                                      std::shared_ptr<rendezvous::KeyValueStore> store,
                                      const StageRunOptions& options) {
  PT_RETURN_IF_ERROR(CheckWeightsDir(c));  // before any step, not after the last
  PT_ASSIGN_OR_RETURN(JobPlan plan, MakeJobPlan(c));
  const int p = plan.ranks();
  if (rank < 0 || rank >= p * c.replicas()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " does not exist: the job has ",
                                                   p * c.replicas(), " ranks (", p, " stages x ",
                                                   c.replicas(), " replicas)"));
  }
  const RankLayout layout{p, c.replicas()};
  const int stage = layout.StageOf(rank), replica = layout.ReplicaOf(rank);
  // The survivors' state, held by their workers, if the host has it: no checkpoint read.
  std::optional<StageStart> from_replicas;
  if (options.replica_state) {
    absl::StatusOr<std::vector<checkpoint::LayerState>> layers =
        options.replica_state(RankLayers(plan, stage));
    if (layers.ok()) {
      from_replicas.emplace();
      from_replicas->first_step = options.replica_state_step;
      from_replicas->layers = *std::move(layers);
    } else {
      std::fprintf(stderr,
                   "pipetrain: rank %d: its state from the survivors' workers: %s; "
                   "reading the checkpoint instead\n",
                   rank, std::string(layers.status().message()).c_str());
    }
  }
  // Alone when the other ranks may not read it (they took the survivors' state).
  std::optional<checkpoint::FoundCheckpoint> resume;
  if (!from_replicas) {
    PT_ASSIGN_OR_RETURN(resume, options.replica_state
                                    ? checkpoint::FindResumePoint(c, plan)
                                    : checkpoint::FindResumePointShared(
                                          *store, c, plan, rank, absl::Seconds(c.timeout_s())));
  }
  if (resume && rank == 0) {
    for (const std::string& why : resume->skipped) {
      std::fprintf(stderr, "pipetrain: resume_from: passed over %s\n", why.c_str());
    }
    std::fprintf(stderr, "pipetrain: resuming at step %lld from %s\n",
                 static_cast<long long>(resume->manifest.step), resume->dir.c_str());
    if (options.listener) options.listener->Resumed(resume->dir, resume->skipped);
  }
  const int64_t first_step = from_replicas ? from_replicas->first_step
                             : resume      ? resume->manifest.step
                                           : 0;
  if (rank == 0 && options.commands) options.commands->StartAt(first_step);
  SetIntraOpThreads(ThreadsPerStage(c, p * c.replicas()));
  PT_ASSIGN_OR_RETURN(c10::Device device,
                      DeviceForRank(c, options.device_index >= 0 ? options.device_index : rank));
  transport::StageTransportOptions topts;
  topts.stage = stage;
  topts.stages = p;
  topts.replica = replica;
  topts.replicas = c.replicas();
  topts.device = device;
  topts.host = options.host;
  topts.connect_timeout = absl::Seconds(c.timeout_s());
  for (int m = 0; m < plan.layout.stages(); ++m) {  // the executor's message numbers
    topts.model_stage_holders.push_back(plan.layout.RankOf(m));
  }
  topts.evaluates = c.eval().every() > 0;
  PT_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> transport,
                      transport::MakeStageTransport(store, topts));
  if (options.wrap_transport) transport = options.wrap_transport(std::move(transport));
  StageListener none;
  StageListener& listener = options.listener ? *options.listener : none;
  StageHandle unused;
  StageHandle& handle = options.handle ? *options.handle : unused;
  handle.AttachTransport(transport.get());
  // Detached on every way out (an error, an exception), before the transport goes.
  absl::Cleanup detach_transport = [&handle] { handle.AttachTransport(nullptr); };
  // The rest runs on the transport; a failure is published before the transport goes (its
  // peers then fail on their connections, and say which rank failed first and why).
  bool attributed = false;  // the run's failure, before Stopped
  absl::StatusOr<StageOutcome> outcome = [&]() -> absl::StatusOr<StageOutcome> {
    MicroBatchReader reader(plan, c.microbatches(), replica);
    StageStart start;
    if (from_replicas) {
      start = *std::move(from_replicas);
    } else {
      PT_ASSIGN_OR_RETURN(start, checkpoint::StageStartFrom(resume, plan, stage));
    }
    start.generation = options.generation;
    PT_ASSIGN_OR_RETURN(StageParts parts, BuildStage(c, plan, reader, stage, start, device));
    start.layers.clear();  // loaded into the stage
    listener.Built(parts.parameter_bytes, RankLayers(plan, stage));
    if (rank == 0) parts.config.commands = options.commands.get();
    if (options.listener) {
      parts.config.on_action = [&listener](const executor::ActionRecord& record) {
        listener.ActionDone(record);
      };
    }
    auto on_step = [&](const executor::StepRecord& step) {
      if ((step.commands_after & control::kCheckpoint) && replica == 0 &&
          !c.checkpoint().dir().empty()) {
        // A failed checkpoint costs only itself: the job goes on (the error is reported).
        // Each model stage the rank holds delivers its layers; the hook hears of the first
        // error and of the commit, if this rank made it.
        checkpoint::SharedCheckpointResult result;
        for (size_t k = 0; k < parts.weights.size(); ++k) {
          checkpoint::SharedCheckpointResult saved = checkpoint::DeliverThroughStore(
              *store, c, plan, step.step + 1, parts.model_stages[k], *parts.weights[k],
              checkpoint::CheckpointWriters{options.generation.number});
          if (!saved.status.ok()) {
            std::fprintf(stderr, "pipetrain: rank %d: checkpoint before step %lld: %s\n", rank,
                         static_cast<long long>(step.step + 1),
                         std::string(saved.status.message()).c_str());
          }
          if (result.status.ok()) result.status = saved.status;
          if (!saved.committed.empty()) result.committed = saved.committed;
        }
        listener.Checkpointed(step.step + 1, result);
      }
      listener.StepDone(step);
    };
    executor::StageExecutor executor(parts.config, parts.weight_stores(), transport.get(), on_step);
    handle.AttachExecutor(&executor);
    absl::Status ran = [&] {
      absl::Cleanup detach_executor = [&handle] { handle.AttachExecutor(nullptr); };
      return executor.Run();
    }();
    if (!ran.ok() && options.listener) {
      ran = AttributeFailure(*store, rank, p, ran);
      attributed = true;
      StoppedRank stopped;
      stopped.error = ran;
      stopped.state = executor.commit_state();
      for (size_t k = 0; k < parts.weights.size(); ++k) {
        stopped.model_stages.emplace_back(parts.model_stages[k], parts.weights[k].get());
      }
      stopped.layers = RankLayers(plan, stage);
      stopped.apply_held_update = [&executor] { return executor.ApplyHeldUpdate(); };
      listener.Stopped(stopped);
    }
    // Leave together: a rank whose last send has left may still close its connections before
    // the peer's transport has taken the message in (seen as "connection closed by peer"
    // at the last micro-batch). So every rank says it is done in the store, and one that
    // finished waits (at most 30 s) until all have, before its transport goes. A rank that
    // failed only says so: its peers are failing too.
    const int world = p * c.replicas();
    if (ran.ok()) {
      absl::Status left = rendezvous::Rendezvous(
          *store, "exit", rank, world, absl::Seconds(std::min(30.0, c.timeout_s())),
          [p](int r) { return absl::StrCat("rank ", r, " (stage ", r % p, ")"); });
      if (!left.ok()) {
        std::fprintf(stderr, "pipetrain: rank %d: leaving without every peer: %s\n", rank,
                     std::string(left.message()).c_str());
      }
    } else {
      (void)store->Set(absl::StrCat("exit/arrived/", rank), "1");
    }
    handle.AttachTransport(nullptr);
    PT_RETURN_IF_ERROR(ran);
    const int64_t peak_memory = PeakResidentMemoryBytes();
    // -1 (a GPU's, not known without a CUDA LibTorch) is reported as 0: not measured.
    const int64_t peak_tensors = std::max<int64_t>(0, memory::PeakTensorBytesOn(device));
    StageOutcome outcome;
    outcome.stats = executor.stats();
    CopyNewestWeights(parts, outcome);
    outcome.parameter_bytes = parts.parameter_bytes;
    outcome.peak_memory_bytes = peak_memory;
    outcome.peak_tensor_bytes = peak_tensors;
    outcome.bytes_sent = transport->bytes_sent();
    return outcome;
  }();
  if (!outcome.ok() && !attributed) return AttributeFailure(*store, rank, p, outcome.status());
  return outcome;
}

checkpoint::SharedCheckpointResult DeliverStoppedRank(rendezvous::KeyValueStore& store,
                                                      const JobSpec& c, const StoppedRank& rank,
                                                      int64_t step, int64_t generation) {
  checkpoint::SharedCheckpointResult result;
  absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
  if (!plan.ok()) {
    result.status = plan.status();
    return result;
  }
  for (const auto& [stage, weights] : rank.model_stages) {
    checkpoint::SharedCheckpointResult saved = checkpoint::DeliverThroughStore(
        store, c, *plan, step, stage, *weights, checkpoint::CheckpointWriters{generation, true});
    if (result.status.ok()) result.status = saved.status;
    if (!saved.committed.empty()) result.committed = saved.committed;
  }
  return result;
}

std::map<int, std::string> StoppedRankLayerBytes(const StoppedRank& rank) {
  std::map<int, std::string> bytes;
  for (size_t k = 0; k < rank.model_stages.size() && k < rank.layers.size(); ++k) {
    const std::vector<checkpoint::LayerState> states =
        checkpoint::StageLayerStates(*rank.model_stages[k].second);
    for (size_t i = 0; i < states.size(); ++i) {
      bytes[rank.layers[k].begin + static_cast<int>(i)] =
          checkpoint::SerializeLayerState(states[i]);
    }
  }
  return bytes;
}

absl::Status WriteStageOutcome(const std::string& dir, int stage, const StageOutcome& out) {
  // Serialized in memory first: LibTorch's writer throws from a destructor when the disk is
  // full (which would end the process); here a failed write is an error like any other.
  std::vector<at::Tensor> tensors = out.parameters;
  tensors.insert(tensors.end(), out.buffers.begin(), out.buffers.end());
  absl::StatusOr<std::string> bytes = weights::SerializeTensorList(tensors);
  if (!bytes.ok()) {
    return absl::InternalError(
        absl::StrCat("stage ", stage, ": its weights: ", bytes.status().message()));
  }
  nlohmann::json j = StatsToJson(out.stats);
  j["num_parameters"] = out.parameters.size();
  j["model_stages"] = out.model_stages;
  j["parameter_counts"] = out.parameter_counts;
  j["buffer_counts"] = out.buffer_counts;
  j["parameter_bytes"] = out.parameter_bytes;
  j["peak_memory_bytes"] = out.peak_memory_bytes;
  j["peak_tensor_bytes"] = out.peak_tensor_bytes;
  j["bytes_sent"] = out.bytes_sent;
  PT_RETURN_IF_ERROR(WriteFileAtomically(OutcomePath(dir, stage, ".pt").string(), *bytes));
  return WriteFileAtomically(OutcomePath(dir, stage, ".json").string(), j.dump());
}

absl::Status CheckWeightsDir(const JobSpec& config) {
  if (config.weights_dir().empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(config.weights_dir(), ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights_dir: cannot create ", config.weights_dir(), ": ", ec.message()));
  }
  const std::string probe =
      (std::filesystem::path(config.weights_dir()) / absl::StrCat(".pipetrain-probe-", getpid()))
          .string();
  if (absl::Status s = WriteFileAtomically(probe, "probe"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("weights_dir: ", s.message()));
  }
  std::filesystem::remove(probe, ec);
  return absl::OkStatus();
}

absl::Status SaveStageWeights(const JobSpec& config, int rank, const StageOutcome& outcome) {
  if (config.weights_dir().empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(config.weights_dir(), ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("weights_dir: cannot create ", config.weights_dir(), ": ", ec.message()));
  }
  absl::Status written = WriteStageOutcome(config.weights_dir(), rank, outcome);
  if (!written.ok()) {
    return absl::Status(written.code(), absl::StrCat("weights_dir: ", written.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StageOutcome> ReadStageOutcome(const std::string& dir, int stage) {
  try {
    std::ifstream in(OutcomePath(dir, stage, ".json"));
    nlohmann::json j = nlohmann::json::parse(in);
    StageOutcome out;
    out.stats = StatsFromJson(j);
    out.parameter_bytes = j.value("parameter_bytes", int64_t{0});
    out.peak_memory_bytes = j.value("peak_memory_bytes", int64_t{0});
    out.peak_tensor_bytes = j.value("peak_tensor_bytes", int64_t{0});
    out.bytes_sent = j.value("bytes_sent", int64_t{0});
    absl::StatusOr<std::vector<at::Tensor>> loaded =
        weights::LoadTensorList(OutcomePath(dir, stage, ".pt").string());
    if (!loaded.ok()) {
      return absl::DataLossError(absl::StrCat("stage ", stage, ": reading its results from ", dir,
                                              ": ", loaded.status().message()));
    }
    const std::vector<at::Tensor>& tensors = *loaded;
    const size_t n = j.at("num_parameters");
    out.parameters.assign(tensors.begin(), tensors.begin() + n);
    out.buffers.assign(tensors.begin() + n, tensors.end());
    out.model_stages = j.at("model_stages").get<std::vector<int>>();
    out.parameter_counts = j.at("parameter_counts").get<std::vector<int>>();
    out.buffer_counts = j.at("buffer_counts").get<std::vector<int>>();
    return out;
  } catch (const std::exception& e) {
    return absl::DataLossError(
        absl::StrCat("stage ", stage, ": reading its results from ", dir, ": ", e.what()));
  }
}

}  // namespace pipetrain::job
