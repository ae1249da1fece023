#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "jobspec/job_config_from_spec.h"
#include "jobspec/step_commands.h"
#include "rpc/status.h"
#include "runtime/base/process_memory.h"
#include "runtime/base/rank_layout.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/job/device.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/rendezvous/key_value_store.h"
#include "worker/data_roots.h"
#include "worker/step_reporter.h"
#include "worker/stage_metrics.h"

namespace pipetrain::worker {
namespace {

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    const WorkerOptions& options, absl::Duration register_timeout,
    std::shared_ptr<CoordinatorClient> coordinator) {
  std::unique_ptr<Worker> w(new Worker(options));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = rpc::MakeServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  // Every call after registering carries this worker's session (rpc::WorkerSession).
  auto channel = rpc::MakeChannel(options.coordinator, options.security, w->session_);
  if (!channel.ok()) return channel.status();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *credentials, &port);
  w->service_ = std::make_unique<WorkerServiceAdapter>(w.get(), w->command_key_);
  builder.RegisterService(w->service_.get());
  w->server_ = builder.BuildAndStart();
  if (!w->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  w->server_->GetHealthCheckService()->SetServingStatus("pipetrain.v1.WorkerService", true);
  w->address_ = absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":", port);
  if (!options.metrics_listen.empty()) {
    auto endpoint = metrics::MetricsEndpoint::Start(options.metrics_listen, &w->metrics_);
    if (!endpoint.ok()) return endpoint.status();
    w->metrics_endpoint_ = *std::move(endpoint);
  }
  w->metrics_.GetGauge("pipetrain_build_info", "1, labelled with the build's version.",
                       {"version", "daemon"}, {PIPETRAIN_VERSION, "worker"}).Set(1);
  w->metrics_.AddCollector(
      "pipetrain_worker_memory_bytes",
      "This worker process's resident memory now (resident) and its high-water mark (peak); "
      "the tensor storage on its device (CPU or GPU) counted at the allocator now (tensors) "
      "and the most since its current or last rank was assigned (tensors_peak).",
      {"kind"}, [tensors_on = job::TensorDeviceOf(options.device)] {
        std::vector<metrics::CollectedSample> samples = {
            {{"resident"}, static_cast<double>(ResidentMemoryBytes())},
            {{"peak"}, static_cast<double>(PeakResidentMemoryBytes())}};
        const int64_t now = memory::TensorBytesInUseOn(tensors_on);
        const int64_t peak = memory::PeakTensorBytesOn(tensors_on);
        // Known on the CPU once the counter is installed; on a GPU where LibTorch has CUDA.
        const bool known = tensors_on.is_cpu() ? memory::CountingTensorMemory()
                                               : now >= 0 && peak >= 0;
        if (known) {
          samples.push_back({{"tensors"}, static_cast<double>(now)});
          samples.push_back({{"tensors_peak"}, static_cast<double>(peak)});
        }
        return samples;
      });
  w->coordinator_ = coordinator != nullptr
                        ? std::move(coordinator)
                        : MakeGrpcCoordinatorClient(v1::CoordinatorService::NewStub(*channel));
  if (absl::Status s = w->Register(absl::Now() + register_timeout); !s.ok()) return s;
  w->heartbeat_thread_ = std::thread([raw = w.get()] { raw->HeartbeatLoop(); });
  return w;
}

std::string Worker::id() const {
  std::lock_guard<std::mutex> lock(mu_);
  return id_;
}

absl::Status Worker::Register(absl::Time deadline) {
  v1::RegisterWorkerRequest request;
  request.set_address(address_);
  request.set_device(options_.device);
  request.set_cores(AvailableCores());
  request.set_command_key(command_key_);
  if (options_.device == "cpu") {
    request.set_memory_bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
                             static_cast<int64_t>(sysconf(_SC_PAGESIZE)));
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  request.set_name(absl::StrCat(host, " pid ", getpid()));
  absl::Status last;
  while (true) {
    absl::StatusOr<v1::RegisterWorkerResponse> response = coordinator_->Register(request);
    last = response.status();
    if (response.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      id_ = response->worker_id();
      session_->Set(response->session());
      cv_.notify_all();  // an assignment may be waiting for the id
      heartbeat_interval_ =
          absl::Milliseconds(std::max<int64_t>(10, response->heartbeat_interval_ms()));
      std::fprintf(stderr, "pipetrain-worker: registered as %s with %s (serving on %s)\n",
                   id_.c_str(), options_.coordinator.c_str(), address_.c_str());
      return absl::OkStatus();
    }
    if (const absl::Status& refused = last;
        absl::IsUnauthenticated(refused) || absl::IsPermissionDenied(refused)) {
      // Retrying cannot help: the token is wrong or missing.
      return absl::Status(refused.code(),
                          absl::StrCat("the coordinator at ", options_.coordinator,
                                       " refused to register this worker (",
                                       absl::StatusCodeToString(refused.code()), ": ",
                                       refused.message(),
                                       "); give its token with --token-file or PIPETRAIN_TOKEN"));
    }
    if (absl::Now() + absl::Milliseconds(200) >= deadline) break;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; })) {
        return absl::CancelledError("stopping");
      }
    }
  }
  return absl::UnavailableError(absl::StrCat("cannot register with the coordinator at ",
                                             options_.coordinator, ": ", last.message()));
}

void Worker::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(heartbeat_interval_)),
                 [this] { return stopping_; });
    if (stopping_) break;
    v1::HeartbeatRequest request;
    request.set_worker_id(id_);
    request.set_job_id(job_id_);
    request.set_rank(rank_);
    request.set_generation(generation_);
    if (executor_) {
      executor::StageActivity activity = executor_->Activity();
      request.set_action(activity.action);
      request.set_waiting_for(activity.waiting_for);
    }
    lock.unlock();
    const absl::Status s = coordinator_->Heartbeat(request);
    lock.lock();
    if (absl::IsNotFound(s) && !stopping_) {
      // The coordinator restarted (or gave this worker up): whatever ran is orphaned, and the
      // old id and session are void until it has registered again.
      AbortStage("the coordinator no longer knows this worker");
      id_.clear();
      session_->Set("");
      lock.unlock();
      absl::Status r = Register(absl::Now() + absl::Seconds(5));
      lock.lock();
      if (!r.ok()) {
        std::fprintf(stderr, "pipetrain-worker: %s\n", std::string(r.message()).c_str());
      }
    }
  }
}

void Worker::AbortStage(const std::string& why) {
  if (job_id_.empty()) return;
  if (stop_reason_.empty()) stop_reason_ = why;
  if (executor_) {
    executor_->Stop(absl::CancelledError(why));  // also a stage that never waits for a peer
  } else if (transport_) {
    transport_->Abort(absl::CancelledError(why));
  }
}

absl::Status Worker::Assign(const v1::StageAssignment& assignment) {
  std::unique_lock<std::mutex> lock(mu_);
  // The coordinator may assign a rank as soon as it has registered this worker, before the
  // answer to RegisterWorker (its id and session) has arrived here: wait for that too.
  cv_.wait_for(lock, std::chrono::seconds(5), [this] { return !id_.empty() || stopping_; });
  if (id_.empty() && !stopping_) {
    return absl::FailedPreconditionError("not registered yet");
  }
  // A stage that has ended (its end being reported) or was told to stop is on its way out:
  // the coordinator may count this worker idle already, so wait for it rather than refuse.
  cv_.wait_for(lock, std::chrono::seconds(8), [this] {
    return job_id_.empty() || stopping_ || !(stage_ending_ || !stop_reason_.empty());
  });
  if (stopping_ || draining_) {
    return absl::UnavailableError("the worker is draining");
  }
  if (job_id_ == assignment.job_id() && rank_ == assignment.rank() &&
      generation_ == assignment.generation() && stop_reason_.empty()) {
    return absl::OkStatus();  // the same assignment again (a retried call): already running
  }
  if (!job_id_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("busy with rank ", rank_, " of ", job_id_));
  }
  if (stage_thread_.joinable()) stage_thread_.join();  // the previous stage, already ended
  job_id_ = assignment.job_id();
  rank_ = assignment.rank();
  generation_ = assignment.generation();
  stop_reason_.clear();
  memory::ResetPeakTensorBytesOn(job::TensorDeviceOf(options_.device));  // one rank at a time
  stage_thread_ = std::thread([this, assignment] { RunAssignment(assignment); });
  return absl::OkStatus();
}

void Worker::StopRank(const v1::StopStageRequest& request) {
  std::lock_guard<std::mutex> lock(mu_);
  // A stop for an earlier generation of the job (sent before this rank was assigned) is not
  // for this stage.
  if (job_id_ == request.job_id() &&
      (request.generation() == 0 || request.generation() == generation_)) {
    AbortStage(absl::StrCat("stopped: ", request.reason()));
  }
}

absl::StatusOr<int64_t> Worker::ScheduleCommand(const v1::SendCommandRequest& request) {
  const uint32_t command = jobspec::StepCommandBit(request.command());
  if (command == 0) return absl::InvalidArgumentError("no step command given");
  std::shared_ptr<control::StepCommandQueue> queue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job_id_ != request.job_id() || rank_ != 0 || !commands_ || !stop_reason_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this worker does not run stage 0 of replica 0 of ", request.job_id(),
                       " (now)"));
    }
    queue = commands_;
  }
  return queue->Schedule(command, request.step());
}

absl::Status Worker::RunStage(const v1::StageAssignment& a, const std::string& worker_id) {
  absl::StatusOr<job::JobConfig> config = jobspec::JobConfigFromSpec(a.spec());
  if (!config.ok()) return config.status();
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
  std::shared_ptr<rendezvous::KeyValueStore> shared_store =
      coordinator_->JobStore(a.job_id());
  const c10::Device device = job::TensorDeviceOf(options_.device);
  if (config->device != (device.is_cuda() ? "cuda" : "cpu")) {
    return absl::FailedPreconditionError(
        absl::StrCat("device: ", config->device, ", but this worker runs on ", options_.device));
  }
  job::StageRunHooks hooks;
  hooks.host = options_.data_host;
  hooks.device_index = job::DeviceIndexOf(options_.device);
  // The previous rank's series (its final values) go now that another starts.
  if (!metrics_job_.empty()) StageMetrics::ForgetJob(&metrics_, metrics_job_);
  metrics_job_ = a.job_id();
  const RankLayout layout{std::max(1, job::PipelineStages(*config)), config->replicas};
  const int stages = layout.stages;
  const int stage = layout.StageOf(a.rank());
  const bool tokens = job::EffectiveDataKind(*config) != "classification";
  StageMetrics stage_metrics(&metrics_, {a.job_id(), stage, layout.ReplicaOf(a.rank()), worker_id},
                             int64_t{config->micro_batches} * config->micro_batch_size,
                             tokens ? config->data.seq_len : 0, stage == stages - 1);
  hooks.on_action = [&stage_metrics](const executor::ActionRecord& r) {
    stage_metrics.OnAction(r);
  };
  if (a.rank() == 0) {
    hooks.commands = std::make_shared<control::StepCommandQueue>(config->steps);
    std::lock_guard<std::mutex> lock(mu_);
    commands_ = hooks.commands;
  }
  // What the rank has to say once goes with its next step report: the checkpoint it
  // committed (the one of the step before the checkpoint's boundary: the coordinator restarts
  // from it), a checkpoint that failed, where rank 0 resumed from. The stage's thread only.
  StepNews news;
  hooks.on_resume = [&news](const std::string& dir, const std::vector<std::string>& skipped) {
    news.resumed_from = dir;
    news.passed_over = skipped;
  };
  hooks.on_checkpoint = [&news](int64_t, const checkpoint::SharedCheckpointResult& result) {
    if (!result.committed.empty()) news.committed_checkpoint = result.committed;
    if (!result.status.ok()) news.failed_checkpoint = std::string(result.status.message());
  };
  hooks.on_transport = [this](transport::Transport* t) {
    std::lock_guard<std::mutex> lock(mu_);
    transport_ = t;
    if (!stop_reason_.empty()) t->Abort(absl::CancelledError(stop_reason_));
  };
  hooks.on_executor = [this, &stage_metrics](executor::StageExecutor* e) {
    stage_metrics.SetExecutor(e);
    std::lock_guard<std::mutex> lock(mu_);
    executor_ = e;
  };
  hooks.on_transport_gone = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    transport_ = nullptr;
  };
  StepReporter reporter(coordinator_, device, [this] {
    std::lock_guard<std::mutex> lock(mu_);
    AbortStage("the coordinator ended the job");
  });
  // Written before the first step, on the stage's thread.
  int64_t parameter_bytes = 0;
  model::LayerRange layers;
  hooks.on_built = [&](int64_t bytes, model::LayerRange built) {
    parameter_bytes = bytes;
    layers = built;
  };
  const absl::Duration report_patience = absl::Seconds(config->recv_timeout_s);
  hooks.on_step = [&](const executor::StepRecord& step) {
    stage_metrics.OnStep(step);
    v1::StepReport report = MakeStepReport(a, worker_id, step, parameter_bytes, layers,
                                           ToBreakdown(stage_metrics.times()),
                                           std::exchange(news, StepNews()));
    if (!reporter.Add(std::move(report), report_patience)) {
      std::lock_guard<std::mutex> lock(mu_);
      AbortStage(absl::StrCat("the coordinator took no step report for ",
                              absl::FormatDuration(report_patience)));
    }
  };
  absl::StatusOr<job::StageOutcome> outcome =
      job::RunStage(*config, a.rank(), shared_store, hooks);
  {
    std::lock_guard<std::mutex> lock(mu_);
    commands_.reset();
  }
  if (!outcome.ok()) return outcome.status();
  return job::SaveStageWeights(*config, a.rank(), *outcome);
}

void Worker::RunAssignment(v1::StageAssignment a) {
  const std::string worker_id = id();
  std::fprintf(stderr, "pipetrain-worker: %s: running rank %d of %s\n", worker_id.c_str(),
               a.rank(), a.job_id().c_str());
  absl::Status result;
  try {
    result = RunStage(a, worker_id);
  } catch (const std::exception& e) {  // out of memory, a LibTorch error: this job's, not ours
    result = absl::InternalError(absl::StrCat("rank ", a.rank(), ": ", e.what()));
  }
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!result.ok()) error = stop_reason_.empty() ? std::string(result.message()) : stop_reason_;
    stage_ending_ = true;
  }
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
  for (int attempt = 0; attempt < kStageEndAttempts; ++attempt) {
    if (coordinator_->ReportStageEnd(end, absl::Seconds(5)).ok()) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  job_id_.clear();
  rank_ = -1;
  generation_ = 0;
  stage_ending_ = false;
  cv_.notify_all();
}

void Worker::Drain() {
  std::string job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || draining_) return;
    draining_ = true;  // no new assignment from here on
    if (job_id_.empty() || stage_ending_ || id_.empty() || !coordinator_) return;
    job = job_id_;
  }
  v1::DrainWorkerRequest request;
  request.set_worker_id(id());
  const absl::StatusOr<v1::DrainWorkerResponse> drained = coordinator_->Drain(request);
  if (!drained.ok() || drained->checkpoint_step() == 0) return;
  const v1::DrainWorkerResponse& response = *drained;
  std::fprintf(stderr, "pipetrain-worker: draining: %s is checkpointed before step %lld and "
               "restarts without this worker; waiting for that (at most %s)\n", job.c_str(),
               static_cast<long long>(response.checkpoint_step()),
               absl::FormatDuration(kDrainTimeout).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(absl::ToInt64Milliseconds(kDrainTimeout)),
               [&] { return job_id_ != job; });
}

void Worker::Stop() {
  constexpr char kWhy[] = "the worker is shutting down";
  Drain();
  std::thread stage;
  v1::StageEnd end;  // of the rank it runs, if any
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (!job_id_.empty() && !stage_ending_ && !id_.empty()) {
      end.set_worker_id(id_);
      end.set_job_id(job_id_);
      end.set_rank(rank_);
      end.set_generation(generation_);
      end.set_error(kWhy);
    }
  }
  cv_.notify_all();  // no heartbeat from here on
  // The coordinator hears why the rank ends before its peers can report losing it (their
  // "connection reset" would otherwise be taken for the job's cause). The stage's own report
  // follows and changes nothing.
  if (coordinator_ && !end.job_id().empty()) {
    (void)coordinator_->ReportStageEnd(end, absl::Milliseconds(500));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    AbortStage(kWhy);
    stage.swap(stage_thread_);
  }
  cv_.notify_all();
  if (stage.joinable()) stage.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  // Leaves the pool at once rather than being found lost two heartbeats later.
  if (coordinator_ && !id().empty()) {
    v1::DeregisterWorkerRequest request;
    request.set_worker_id(id());
    (void)coordinator_->Deregister(request);
  }
  if (server_) server_->Shutdown(In(absl::Seconds(2)));
}

Worker::~Worker() { Stop(); }

}  // namespace pipetrain::worker
