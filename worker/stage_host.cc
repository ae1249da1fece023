// One assigned rank, hosted from start to end. See stage_host.h.
#include "worker/stage_host.h"

#include <algorithm>
#include <exception>
#include <functional>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/rank_layout.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/device.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/rendezvous/key_value_store.h"
#include "worker/data_roots.h"
#include "worker/replica_state_fetch.h"
#include "worker/stage_metrics.h"
#include "worker/step_reporter.h"

namespace pipetrain::worker {

namespace {

// What an assigned rank's run says, carried to the coordinator and the worker's metrics: every
// action and step to the metrics, every step as a step report (with what the rank has to say
// once: the checkpoint it committed or that failed, where rank 0 resumed from, where its state
// came from), and a failed run's state to the survivors' handoff when the job commits its
// steps. The stage's thread only, but news(), which the replica-state fetch on that thread
// writes.
class AssignedRankListener : public job::StageListener {
 public:
  AssignedRankListener(const v1::StageAssignment& assignment, const std::string& worker_id,
                       StageMetrics& metrics, StepReporter& reporter, c10::Device device,
                       absl::Duration report_patience,
                       std::function<void(const std::string&)> stop_any)
      : assignment_(assignment),
        worker_id_(worker_id),
        metrics_(metrics),
        reporter_(reporter),
        device_(device),
        report_patience_(report_patience),
        stop_any_(std::move(stop_any)) {}

  // Called with the rank's state when its run fails (StageListener::Stopped).
  void HandOffWhenStopped(std::function<void(const job::StoppedRank&)> hand_off) {
    hand_off_ = std::move(hand_off);
  }
  // What goes with the next step report.
  StepNews& news() { return news_; }

  void Resumed(const std::string& dir, const std::vector<std::string>& passed_over) override {
    news_.resumed_from = dir;
    news_.passed_over = passed_over;
  }
  void Built(int64_t parameter_bytes, const std::vector<model::LayerRange>& layers) override {
    parameter_bytes_ = parameter_bytes;
    // A rank holding several model stages reports its first (the step report has one range).
    if (!layers.empty()) layers_ = layers.front();
  }
  void ActionDone(const executor::ActionRecord& record) override { metrics_.OnAction(record); }
  void Checkpointed(int64_t, const checkpoint::SharedCheckpointResult& result) override {
    // The one of the step before the checkpoint's boundary: the coordinator restarts from it.
    if (!result.committed.empty()) news_.committed_checkpoint = result.committed;
    if (!result.status.ok()) news_.failed_checkpoint = std::string(result.status.message());
  }
  void StepDone(const executor::StepRecord& step) override {
    metrics_.OnStep(step);
    // The tensor peak read here, on the stage's thread: up to this step, whenever it is sent
    // (-1, a GPU's without a CUDA LibTorch, goes as 0: not measured).
    v1::StepReport report = MakeStepReport(
        assignment_, worker_id_, step, parameter_bytes_, memory::PeakTensorBytesOn(device_),
        layers_, ToBreakdown(metrics_.times()), std::exchange(news_, StepNews()));
    if (!reporter_.Add(std::move(report), report_patience_)) {
      stop_any_(absl::StrCat("the coordinator took no step report for ",
                             absl::FormatDuration(report_patience_)));
    }
  }
  void Stopped(const job::StoppedRank& rank) override {
    if (hand_off_) hand_off_(rank);
  }

 private:
  const v1::StageAssignment& assignment_;
  const std::string& worker_id_;
  StageMetrics& metrics_;
  StepReporter& reporter_;
  const c10::Device device_;
  const absl::Duration report_patience_;
  const std::function<void(const std::string&)> stop_any_;
  std::function<void(const job::StoppedRank&)> hand_off_;
  StepNews news_;
  int64_t parameter_bytes_ = 0;  // written before the first step
  model::LayerRange layers_;
};

}  // namespace

StageHost::StageHost(StageHostOptions options, std::shared_ptr<CoordinatorClient> coordinator,
                     metrics::Registry* metrics, StageSlot* slot, HeldStates* held)
    : options_(std::move(options)),
      coordinator_(std::move(coordinator)),
      metrics_(metrics),
      slot_(slot),
      held_(held) {}

absl::Status StageHost::RunStage(const v1::StageAssignment& a, const std::string& worker_id,
                                 SurvivorOutcome& survivor) {
  absl::StatusOr<job::JobSpec> config = job::Validated(a.spec());
  if (!config.ok()) return config.status();
  for (const auto& [field, path] :
       {std::pair<const char*, const std::string*>{"data.path", &config->data().path()},
        {"model.path", &config->model().path()}}) {
    if (!path->empty()) PT_RETURN_IF_ERROR(CheckUnderDataRoots(field, *path, options_.data_roots));
  }
  const std::vector<std::string> writable = WritableRoots(options_.data_roots);
  for (const auto& [field, dir] :
       {std::pair<const char*, std::string>{"checkpoint.dir", config->checkpoint().dir()},
        {"weights_dir", config->weights_dir()},
        {"resume_from",
         config->resume_from() == "latest" ? std::string() : config->resume_from()}}) {
    PT_RETURN_IF_ERROR(CheckDirectoryUnderRoots(field, dir, writable));
  }
  std::shared_ptr<rendezvous::KeyValueStore> shared_store =
      coordinator_->JobStore(a.job_id(), a.generation());
  const c10::Device device = job::TensorDeviceOf(options_.device);
  if (config->device() != (device.is_cuda() ? "cuda" : "cpu")) {
    return absl::FailedPreconditionError(
        absl::StrCat("device: ", config->device(), ", but this worker runs on ", options_.device));
  }
  job::StageRunOptions run;
  run.generation.number = a.generation();
  run.generation.commit_steps = a.commit_steps();
  run.generation.skipped_in_a_row = a.skipped_in_a_row();
  run.host = options_.data_host;
  run.device_index = job::DeviceIndexOf(options_.device);
  // The previous rank's series (its final values) go now that another starts.
  if (!metrics_job_.empty()) StageMetrics::ForgetJob(metrics_, metrics_job_);
  metrics_job_ = a.job_id();
  const RankLayout layout{std::max(1, job::PipelineStages(*config)), config->replicas()};
  const int stage = layout.StageOf(a.rank());
  const bool tokens = job::DataKindOf(*config) != "classification";
  // A stop ends every wait of the stage on the job's store at once (the coordinator may be
  // out of reach: its calls would otherwise run to their deadlines) and reaches the stage
  // through its handle (its transport, then its executor; also a stage that never waits for
  // a peer). Shared with the stopper: a stop that comes after the stage returned still finds
  // both.
  const std::shared_ptr<rendezvous::KeyValueStore> store = shared_store;
  const auto handle = std::make_shared<job::StageHandle>();
  run.handle = handle.get();
  slot_->SetStopper([store, handle](const absl::Status& why) {
    store->Abort(why);
    handle->Stop(why);
  });
  slot_->SetActivitySource([handle] {
    const std::optional<executor::StageActivity> activity = handle->Activity();
    return activity ? StageSlot::Activity{activity->action, activity->waiting_for}
                    : StageSlot::Activity{};
  });
  StageMetrics stage_metrics(metrics_, {a.job_id(), stage, layout.ReplicaOf(a.rank()), worker_id},
                             int64_t{config->microbatches()} * config->microbatch_size(),
                             tokens ? config->data().seq_len() : 0, stage == layout.stages - 1,
                             handle);
  if (a.rank() == 0) {
    run.commands = std::make_shared<control::StepCommandQueue>(config->steps());
    slot_->SetCommandQueue(run.commands);
  }
  StepReporter reporter(coordinator_, [this] { slot_->StopAny("the coordinator ended the job"); });
  AssignedRankListener listener(a, worker_id, stage_metrics, reporter, device,
                                absl::Seconds(config->timeout_s()),
                                [this](const std::string& why) { slot_->StopAny(why); });
  if (a.commit_steps()) {
    // Its state is handed off before it is gone: the survivors of a fault may go on from it.
    listener.HandOffWhenStopped([&](const job::StoppedRank& stopped) {
      survivor = HandOffSurvivor(
          *coordinator_, a, worker_id, *config, stopped, [this] { return slot_->closed(); }, held_);
    });
  }
  run.listener = &listener;
  if (a.has_replica_state() && a.replica_state().layers_size() > 0) {
    ReplicaStateSource source;
    source.job_id = a.job_id();
    source.own_address = options_.address;
    source.local = held_;
    source.security = options_.security;
    source.spread = layout.ReplicaOf(a.rank());
    source.timeout = absl::Seconds(config->timeout_s());
    run.replica_state_step = a.replica_state().step();
    run.replica_state = [&a, &listener, source](const std::vector<model::LayerRange>& layers) {
      ReplicaStateFetch fetch;
      absl::StatusOr<std::vector<checkpoint::LayerState>> states =
          FetchReplicaState(a.replica_state(), layers, source, &fetch);
      if (states.ok()) {
        listener.news().state_from_replicas =
            absl::StrCat("its state at step ", a.replica_state().step(),
                         " from the survivors: ", fetch.Describe());
      }
      return states;
    };
  }
  absl::StatusOr<job::StageOutcome> outcome = job::RunStage(*config, a.rank(), shared_store, run);
  slot_->SetCommandQueue(nullptr);
  // A stopped stage's last reports are of a generation that is over (or for a coordinator out
  // of reach): one try, no resends that would hold its end back.
  if (!slot_->occupant().stop_reason.empty()) reporter.Abandon();
  if (!outcome.ok()) return outcome.status();
  return job::SaveStageWeights(*config, a.rank(), *outcome);
}

void StageHost::Run(const v1::StageAssignment& a, const std::string& worker_id) {
  memory::ResetPeakTensorBytesOn(job::TensorDeviceOf(options_.device));  // one rank at a time
  std::fprintf(stderr, "pipetrain-worker: %s: running rank %d of %s\n", worker_id.c_str(), a.rank(),
               a.job_id().c_str());
  absl::Status result;
  SurvivorOutcome survivor;
  try {
    result = RunStage(a, worker_id, survivor);
  } catch (const std::exception& e) {  // out of memory, a LibTorch error: this job's, not ours
    result = absl::InternalError(absl::StrCat("rank ", a.rank(), ": ", e.what()));
  }
  const std::string stop_reason = slot_->MarkEnded();
  const std::string error = result.ok()           ? std::string()
                            : stop_reason.empty() ? std::string(result.message())
                                                  : stop_reason;
  std::fprintf(stderr, "pipetrain-worker: %s: rank %d of %s %s%s\n", worker_id.c_str(), a.rank(),
               a.job_id().c_str(), result.ok() ? "finished" : "failed: ", error.c_str());
  v1::StageEnd end;
  end.set_worker_id(worker_id);
  end.set_job_id(a.job_id());
  end.set_rank(a.rank());
  end.set_generation(a.generation());
  end.set_ok(result.ok());
  end.set_error(error);
  end.set_failed_after_peer(result.GetPayload(job::kFailedAfterPeerPayload).has_value());
  end.set_survivor_checkpoint(survivor.checkpoint);
  end.set_survivor_step(survivor.step);
  end.set_survivor_failed(survivor.failed);
  for (int attempt = 0; attempt < kStageEndAttempts; ++attempt) {
    if (coordinator_->ReportStageEnd(end, absl::Seconds(5)).ok()) break;
  }
  slot_->Release();
}

}  // namespace pipetrain::worker
