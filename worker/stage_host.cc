// One assigned rank, hosted from start to end. See stage_host.h.
#include "worker/stage_host.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "jobspec/job_config_from_spec.h"
#include "runtime/base/rank_layout.h"
#include "runtime/base/status_macros.h"
#include "runtime/job/device.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/rendezvous/key_value_store.h"
#include "worker/data_roots.h"
#include "worker/replica_state_fetch.h"
#include "worker/stage_metrics.h"
#include "worker/step_reporter.h"

namespace pipetrain::worker {

StageHost::StageHost(StageHostOptions options, std::shared_ptr<CoordinatorClient> coordinator,
                     metrics::Registry* metrics, StageSlot* slot, HeldStates* held)
    : options_(std::move(options)),
      coordinator_(std::move(coordinator)),
      metrics_(metrics),
      slot_(slot),
      held_(held) {}

absl::Status StageHost::RunStage(const v1::StageAssignment& a, const std::string& worker_id,
                                 SurvivorOutcome& survivor) {
  absl::StatusOr<job::JobConfig> config = jobspec::JobConfigFromSpec(a.spec());
  if (!config.ok()) return config.status();
  config->commit_steps = a.commit_steps();
  config->skipped_in_a_row = a.skipped_in_a_row();
  for (const auto& [field, path] : {std::pair<const char*, const std::string*>{
                                        "data.path", &config->data.path},
                                    {"model.path", &config->model.torchscript_path}}) {
    if (!path->empty()) PT_RETURN_IF_ERROR(CheckUnderDataRoots(field, *path, options_.data_roots));
  }
  const std::vector<std::string> writable = WritableRoots(options_.data_roots);
  for (const auto& [field, dir] : {std::pair<const char*, std::string>{
                                       "checkpoint.dir", config->checkpoint.dir},
                                   {"weights_dir", config->weights_dir},
                                   {"resume_from", config->resume_from == "latest"
                                                       ? std::string()
                                                       : config->resume_from}}) {
    PT_RETURN_IF_ERROR(CheckDirectoryUnderRoots(field, dir, writable));
  }
  std::shared_ptr<rendezvous::KeyValueStore> shared_store = coordinator_->JobStore(a.job_id(), a.generation());
  const c10::Device device = job::TensorDeviceOf(options_.device);
  if (config->device != (device.is_cuda() ? "cuda" : "cpu")) {
    return absl::FailedPreconditionError(
        absl::StrCat("device: ", config->device, ", but this worker runs on ", options_.device));
  }
  job::StageRunHooks hooks;
  hooks.host = options_.data_host;
  hooks.device_index = job::DeviceIndexOf(options_.device);
  // The previous rank's series (its final values) go now that another starts.
  if (!metrics_job_.empty()) StageMetrics::ForgetJob(metrics_, metrics_job_);
  metrics_job_ = a.job_id();
  const RankLayout layout{std::max(1, job::PipelineStages(*config)), config->replicas};
  const int stage = layout.StageOf(a.rank());
  const bool tokens = job::EffectiveDataKind(*config) != "classification";
  StageMetrics stage_metrics(metrics_, {a.job_id(), stage, layout.ReplicaOf(a.rank()), worker_id},
                             int64_t{config->micro_batches} * config->micro_batch_size,
                             tokens ? config->data.seq_len : 0, stage == layout.stages - 1);
  hooks.on_action = [&stage_metrics](const executor::ActionRecord& r) {
    stage_metrics.OnAction(r);
  };
  if (a.rank() == 0) {
    hooks.commands = std::make_shared<control::StepCommandQueue>(config->steps);
    slot_->SetCommandQueue(hooks.commands);
  }
  // What the rank has to say once goes with its next step report: the checkpoint it
  // committed (the one of the step before the checkpoint's boundary: the coordinator restarts
  // from it), a checkpoint that failed, where rank 0 resumed from. The stage's thread only.
  StepNews news;
  hooks.on_resume = [&news](const std::string& dir, const std::vector<std::string>& skipped) {
    news.resumed_from = dir;
    news.passed_over = skipped;
  };
  if (a.has_replica_state() && a.replica_state().layers_size() > 0) {
    ReplicaStateSource source;
    source.job_id = a.job_id();
    source.own_address = options_.address;
    source.local = held_;
    source.security = options_.security;
    source.spread = layout.ReplicaOf(a.rank());
    source.timeout = absl::Seconds(config->recv_timeout_s);
    hooks.replica_state_step = a.replica_state().step();
    hooks.replica_state = [&a, &news, source](const std::vector<model::LayerRange>& layers) {
      ReplicaStateFetch fetch;
      absl::StatusOr<std::vector<checkpoint::LayerState>> states =
          FetchReplicaState(a.replica_state(), layers, source, &fetch);
      if (states.ok()) {
        news.state_from_replicas = absl::StrCat("its state at step ", a.replica_state().step(),
                                                " from the survivors: ", fetch.Describe());
      }
      return states;
    };
  }
  hooks.on_checkpoint = [&news](int64_t, const checkpoint::SharedCheckpointResult& result) {
    if (!result.committed.empty()) news.committed_checkpoint = result.committed;
    if (!result.status.ok()) news.failed_checkpoint = std::string(result.status.message());
  };
  // A stop ends every wait of the stage on the job's store at once (the coordinator may be
  // out of reach: its calls would otherwise run to their deadlines), and reaches the stage
  // itself through its transport until its executor exists (which also stops a stage that
  // never waits for a peer), then through the executor.
  // (Shared with the stoppers: a stop that comes after the stage returned still finds it.)
  const std::shared_ptr<rendezvous::KeyValueStore> store = shared_store;
  slot_->SetStopper([store](const absl::Status& why) { store->Abort(why); });
  transport::Transport* transport = nullptr;
  hooks.on_transport = [this, store, &transport](transport::Transport* t) {
    transport = t;
    slot_->SetStopper([store, t](const absl::Status& why) {
      store->Abort(why);
      t->Abort(why);
    });
  };
  hooks.on_executor = [this, store, &stage_metrics, &transport](executor::StageExecutor* e) {
    stage_metrics.SetExecutor(e);
    if (e != nullptr) {
      slot_->SetStopper([store, e](const absl::Status& why) {
        store->Abort(why);
        e->Stop(why);
      });
      slot_->SetActivitySource([e] {
        executor::StageActivity activity = e->Activity();
        return StageSlot::Activity{activity.action, activity.waiting_for};
      });
    } else {
      slot_->SetActivitySource(nullptr);
      transport::Transport* t = transport;
      slot_->SetStopper([store, t](const absl::Status& why) {
        store->Abort(why);
        if (t != nullptr) t->Abort(why);
      });
    }
  };
  hooks.on_transport_gone = [this, store] {
    slot_->SetStopper([store](const absl::Status& why) { store->Abort(why); });
  };
  StepReporter reporter(coordinator_,
                        [this] { slot_->StopAny("the coordinator ended the job"); });
  // Written before the first step, on the stage's thread.
  int64_t parameter_bytes = 0;
  model::LayerRange layers;
  hooks.on_built = [&](int64_t bytes, const std::vector<model::LayerRange>& built) {
    parameter_bytes = bytes;
    // A rank holding several model stages reports its first (the step report has one range).
    if (!built.empty()) layers = built.front();
  };
  const absl::Duration report_patience = absl::Seconds(config->recv_timeout_s);
  hooks.on_step = [&](const executor::StepRecord& step) {
    stage_metrics.OnStep(step);
    // The tensor peak read here, on the stage's thread: up to this step, whenever it is sent
    // (-1, a GPU's without a CUDA LibTorch, goes as 0: not measured).
    v1::StepReport report = MakeStepReport(a, worker_id, step, parameter_bytes,
                                           memory::PeakTensorBytesOn(device), layers,
                                           ToBreakdown(stage_metrics.times()),
                                           std::exchange(news, StepNews()));
    if (!reporter.Add(std::move(report), report_patience)) {
      slot_->StopAny(absl::StrCat("the coordinator took no step report for ",
                                  absl::FormatDuration(report_patience)));
    }
  };
  if (a.commit_steps()) {
    // Its state is handed off before it is gone: the survivors of a fault may go on from it.
    hooks.on_stopped = [&](const job::StoppedRank& stopped) {
      survivor = HandOffSurvivor(*coordinator_, a, worker_id, *config, stopped,
                                 [this] { return slot_->closed(); }, held_);
    };
  }
  absl::StatusOr<job::StageOutcome> outcome =
      job::RunStage(*config, a.rank(), shared_store, hooks);
  slot_->SetCommandQueue(nullptr);
  // A stopped stage's last reports are of a generation that is over (or for a coordinator out
  // of reach): one try, no resends that would hold its end back.
  if (!slot_->occupant().stop_reason.empty()) reporter.Abandon();
  if (!outcome.ok()) return outcome.status();
  return job::SaveStageWeights(*config, a.rank(), *outcome);
}

void StageHost::Run(const v1::StageAssignment& a, const std::string& worker_id) {
  memory::ResetPeakTensorBytesOn(job::TensorDeviceOf(options_.device));  // one rank at a time
  std::fprintf(stderr, "pipetrain-worker: %s: running rank %d of %s\n", worker_id.c_str(),
               a.rank(), a.job_id().c_str());
  absl::Status result;
  SurvivorOutcome survivor;
  try {
    result = RunStage(a, worker_id, survivor);
  } catch (const std::exception& e) {  // out of memory, a LibTorch error: this job's, not ours
    result = absl::InternalError(absl::StrCat("rank ", a.rank(), ": ", e.what()));
  }
  const std::string stop_reason = slot_->MarkEnded();
  const std::string error =
      result.ok() ? std::string() : stop_reason.empty() ? std::string(result.message()) : stop_reason;
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
