#include "worker/worker.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <thread>
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
#include "runtime/job/stage_run.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/rendezvous/key_value_store.h"
#include "worker/coordinator_store.h"
#include "worker/stage_metrics.h"

namespace pipetrain::worker {
namespace {

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Sends a stage's step reports to the coordinator from a thread of its own, in order, so
// that the stage never waits for an RPC (a slow or absent coordinator must not stall the
// pipeline). `on_stop` runs when the coordinator answers that the job no longer runs.
class StepReporter {
 public:
  // `tensors_on`: the device whose tensor peak goes with every report.
  StepReporter(std::shared_ptr<v1::CoordinatorService::Stub> coordinator,
               c10::Device tensors_on, std::function<void()> on_stop)
      : coordinator_(std::move(coordinator)), tensors_on_(tensors_on),
        on_stop_(std::move(on_stop)), thread_([this] { Loop(); }) {}
  // Sends what is queued (in one call with 5 s), then stops.
  ~StepReporter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Queues a report. While kMaxQueued are waiting (steps faster than the coordinator takes
  // them), waits for room up to `patience`: the stage runs at the pace the coordinator can
  // follow. False if there was no room by then (the report is dropped).
  bool Add(v1::StepReport report, absl::Duration patience) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!room_.wait_for(lock, absl::ToChronoNanoseconds(patience),
                          [this] { return queue_.size() < kMaxQueued; })) {
        return false;
      }
      queue_.push_back(std::move(report));
    }
    cv_.notify_all();
    return true;
  }

 private:
  // Sends what has queued up in one ReportSteps, at most every kMinInterval: a fast step
  // costs no RPC of its own (on a few shared cores every RPC takes CPU from the stages).
  static constexpr auto kMinInterval = std::chrono::milliseconds(100);
  // Reports waiting to be sent, or kept for resending while the coordinator does not answer
  // (its job is failed by then: two missed heartbeats). About 150 bytes each.
  static constexpr size_t kMaxQueued = 4000;
  static constexpr size_t kMaxBatch = 1000;
  // No answer (RESOURCE_EXHAUSTED is not one: a batch over the coordinator's request limit
  // would be refused again however often it were sent).
  static bool IsTransient(grpc::StatusCode code) {
    return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    auto last_sent = std::chrono::steady_clock::now() - kMinInterval;
    while (true) {
      cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      cv_.wait_until(lock, last_sent + kMinInterval,
                     [this] { return closing_ || queue_.size() >= kMaxBatch; });
      // At most kMaxBatch a call (the coordinator takes requests of about 1 MiB).
      v1::StepReports batch;
      while (!queue_.empty() && static_cast<size_t>(batch.reports_size()) < kMaxBatch) {
        *batch.add_reports() = std::move(queue_.front());
        queue_.pop_front();
      }
      room_.notify_all();
      lock.unlock();
      // The process's memory high-water, read here (once per batch) rather than on the
      // stage's thread at every step.
      const int64_t peak_memory = PeakResidentMemoryBytes();
      // -1 (not known: a GPU's without a CUDA LibTorch) goes as 0, "not measured".
      const int64_t peak_tensors = std::max<int64_t>(0, memory::PeakTensorBytesOn(tensors_on_));
      for (v1::StepReport& r : *batch.mutable_reports()) {
        r.set_peak_memory_bytes(peak_memory);
        r.set_peak_tensor_bytes(peak_tensors);
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(In(absl::Seconds(5)));
      v1::ReportResponse response;
      const grpc::Status sent = coordinator_->ReportSteps(&ctx, batch, &response);
      if (sent.ok() && response.stop()) on_stop_();
      last_sent = std::chrono::steady_clock::now();
      lock.lock();
      // Not taken for want of an answer: sent again, in order, with the next batch (the
      // coordinator skips reports it has counted already). Refused ones are not resent.
      if (IsTransient(sent.error_code())) {
        for (int i = batch.reports_size() - 1; i >= 0; --i) {
          queue_.push_front(std::move(*batch.mutable_reports(i)));
        }
        while (queue_.size() > kMaxQueued) queue_.pop_front();
      }
    }
  }

  std::shared_ptr<v1::CoordinatorService::Stub> coordinator_;
  const c10::Device tensors_on_;
  std::function<void()> on_stop_;
  std::mutex mu_;
  std::condition_variable cv_;    // the reporter's thread: reports, or closing
  std::condition_variable room_;  // Add(): the queue has room
  std::deque<v1::StepReport> queue_;
  bool closing_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

}  // namespace

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options,
                                                      absl::Duration register_timeout) {
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
  builder.RegisterService(w.get());
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
      {"kind"}, [tensors_on = TensorDevice(options.device)] {
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
  w->coordinator_ = v1::CoordinatorService::NewStub(*channel);
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
  grpc::Status last;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::RegisterWorkerResponse response;
    last = coordinator_->RegisterWorker(&ctx, request, &response);
    if (last.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      id_ = response.worker_id();
      session_->Set(response.session());
      cv_.notify_all();  // an assignment may be waiting for the id
      heartbeat_interval_ = absl::Milliseconds(std::max<int64_t>(10, response.heartbeat_interval_ms()));
      std::fprintf(stderr, "pipetrain-worker: registered as %s with %s (serving on %s)\n",
                   id_.c_str(), options_.coordinator.c_str(), address_.c_str());
      return absl::OkStatus();
    }
    if (const absl::Status refused = rpc::ToAbslStatus(last);
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
                                             options_.coordinator, ": ", last.error_message()));
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
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(2)));
    v1::HeartbeatResponse response;
    grpc::Status s = coordinator_->Heartbeat(&ctx, request, &response);
    lock.lock();
    if (s.error_code() == grpc::StatusCode::NOT_FOUND && !stopping_) {
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

grpc::Status Worker::RefuseWithoutCommandKey(const grpc::ServerContext& context) const {
  if (rpc::CarriesCommandKey(context, command_key_)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "only the coordinator this worker registered with may command it "
                      "(missing or wrong command key)");
}

grpc::Status Worker::Ping(grpc::ServerContext* context, const v1::PingRequest*,
                          v1::PingResponse*) {
  return RefuseWithoutCommandKey(*context);
}

grpc::Status Worker::AssignStage(grpc::ServerContext* context, const v1::StageAssignment* request,
                                 v1::AssignResponse*) {
  if (grpc::Status s = RefuseWithoutCommandKey(*context); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  // The coordinator may assign a rank as soon as it has registered this worker, before the
  // answer to RegisterWorker (its id and session) has arrived here: wait for that too.
  cv_.wait_for(lock, std::chrono::seconds(5), [this] { return !id_.empty() || stopping_; });
  if (id_.empty() && !stopping_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not registered yet");
  }
  // A stage that has ended (its end being reported) or was told to stop is on its way out:
  // the coordinator may count this worker idle already, so wait for it rather than refuse.
  cv_.wait_for(lock, std::chrono::seconds(8), [this] {
    return job_id_.empty() || stopping_ || !(stage_ending_ || !stop_reason_.empty());
  });
  if (stopping_ || draining_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is draining");
  }
  if (job_id_ == request->job_id() && rank_ == request->rank() &&
      generation_ == request->generation() && stop_reason_.empty()) {
    return grpc::Status::OK;  // the same assignment again (a retried call): already running
  }
  if (!job_id_.empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("busy with rank ", rank_, " of ", job_id_));
  }
  if (stage_thread_.joinable()) stage_thread_.join();  // the previous stage, already ended
  job_id_ = request->job_id();
  rank_ = request->rank();
  generation_ = request->generation();
  stop_reason_.clear();
  memory::ResetPeakTensorBytesOn(TensorDevice(options_.device));  // one rank at a time
  stage_thread_ = std::thread([this, assignment = *request] { RunAssignment(assignment); });
  return grpc::Status::OK;
}

grpc::Status Worker::StopStage(grpc::ServerContext* context, const v1::StopStageRequest* request,
                               v1::AssignResponse*) {
  if (grpc::Status s = RefuseWithoutCommandKey(*context); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  // A stop for an earlier generation of the job (sent before this rank was assigned) is not
  // for this stage.
  if (job_id_ == request->job_id() &&
      (request->generation() == 0 || request->generation() == generation_)) {
    AbortStage(absl::StrCat("stopped: ", request->reason()));
  }
  return grpc::Status::OK;
}

grpc::Status Worker::ScheduleCommand(grpc::ServerContext* context,
                                     const v1::SendCommandRequest* request,
                                     v1::SendCommandResponse* response) {
  if (grpc::Status s = RefuseWithoutCommandKey(*context); !s.ok()) return s;
  const uint32_t command = jobspec::StepCommandBit(request->command());
  if (command == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no step command given");
  }
  std::shared_ptr<control::StepCommandQueue> queue;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job_id_ != request->job_id() || rank_ != 0 || !commands_ || !stop_reason_.empty()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("this worker does not run stage 0 of replica 0 of ",
                                       request->job_id(), " (now)"));
    }
    queue = commands_;
  }
  absl::StatusOr<int64_t> step = queue->Schedule(command, request->step());
  if (!step.ok()) return rpc::ToGrpcStatus(step.status());
  response->set_step(*step);
  return grpc::Status::OK;
}

absl::Status CheckUnderDataRoots(const std::string& field, const std::string& path,
                                 const std::vector<std::string>& roots) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (stat(resolved, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat(field, ": ", path, " is not a regular file (this worker reads only files)"));
  }
  if (IsUnderRoots(resolved, ResolvedRoots(roots))) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", path, " is outside the directories this worker reads jobs' files from (",
      roots.empty() ? "none: it was started without --data-root" : absl::StrJoin(roots, ", "),
      ")"));
}

std::vector<std::string> WritableRoots(const std::vector<std::string>& data_roots) {
  if (data_roots.empty()) return {};
  std::vector<std::string> roots = data_roots;
  std::error_code ec;
  roots.push_back((std::filesystem::current_path(ec) / "checkpoints").string());
  return roots;
}

absl::Status CheckDirectoryUnderRoots(const std::string& field, const std::string& dir,
                                      const std::vector<std::string>& roots) {
  if (roots.empty() || dir.empty()) return absl::OkStatus();
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::absolute(dir, ec).lexically_normal();
  std::filesystem::path existing = target;
  while (!existing.empty() && !std::filesystem::exists(existing, ec) &&
         existing != existing.root_path()) {
    existing = existing.parent_path();
  }
  char resolved[PATH_MAX];
  const std::vector<std::string> resolved_roots = ResolvedRoots(roots);
  // Below its nearest existing ancestor nothing exists, so nothing can be a link: the
  // directory is inside if that ancestor (links resolved) is, or if the ancestor leads to a
  // root not made yet (checkpoints/) and the directory, as written, lies under that root.
  bool inside = false;
  if (realpath(existing.c_str(), resolved) != nullptr) {
    const std::string ancestor = resolved;
    const std::filesystem::path rest = target.lexically_relative(existing);
    const std::string lexical = (std::filesystem::path(ancestor) / rest).lexically_normal();
    inside = IsUnderRoots(ancestor, resolved_roots) ||
             (rest.native().rfind("..", 0) != 0 && IsUnderRoots(lexical, resolved_roots));
  }
  if (inside) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": ", dir, " is outside the directories this worker lets jobs write to and resume "
      "from (", absl::StrJoin(roots, ", "), ")"));
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
      MakeCoordinatorStore(coordinator_, a.job_id());
  const c10::Device device = TensorDevice(options_.device);
  if (config->device != (device.is_cuda() ? "cuda" : "cpu")) {
    return absl::FailedPreconditionError(
        absl::StrCat("device: ", config->device, ", but this worker runs on ", options_.device));
  }
  job::StageRunHooks hooks;
  hooks.host = options_.data_host;
  hooks.device_index = WorkerDeviceIndex(options_.device);
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
  // The checkpoint this rank committed, if any, goes with its next step report (the one of
  // the step before the checkpoint's boundary): the coordinator restarts from it.
  std::string committed_checkpoint, failed_checkpoint;  // the stage's thread only
  // Where rank 0 resumed from, and what it passed over: with its first step report.
  std::string resumed_from;
  std::vector<std::string> passed_over;
  hooks.on_resume = [&](const std::string& dir, const std::vector<std::string>& skipped) {
    resumed_from = dir;
    passed_over = skipped;
  };
  hooks.on_checkpoint = [&](int64_t, const job::SharedCheckpointResult& result) {
    if (!result.committed.empty()) committed_checkpoint = result.committed;
    if (!result.status.ok()) failed_checkpoint = std::string(result.status.message());
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
  int64_t parameter_bytes = 0;  // written before the first step, on the stage's thread
  hooks.on_built = [&parameter_bytes](int64_t bytes) { parameter_bytes = bytes; };
  const absl::Duration report_patience = absl::Seconds(config->recv_timeout_s);
  hooks.on_step = [&](const executor::StepRecord& step) {
    stage_metrics.OnStep(step);
    v1::StepReport report;
    report.set_worker_id(worker_id);
    report.set_job_id(a.job_id());
    report.set_rank(a.rank());
    report.set_generation(a.generation());
    report.set_step(step.step);
    if (!committed_checkpoint.empty()) {
      report.set_checkpoint_committed(committed_checkpoint);
      committed_checkpoint.clear();
    }
    if (!failed_checkpoint.empty()) {
      report.set_checkpoint_failed(failed_checkpoint.substr(0, 1024));
      failed_checkpoint.clear();
    }
    if (!resumed_from.empty()) {
      report.set_resumed_from(resumed_from.substr(0, 4096));
      for (size_t i = 0; i < passed_over.size() && i < 16; ++i) {
        report.add_passed_over(passed_over[i].substr(0, 1024));
      }
      resumed_from.clear();
      passed_over.clear();
    }
    if (step.mean_loss) {
      report.set_has_loss(true);
      report.set_loss(*step.mean_loss);
    }
    report.set_end_s(step.end_s);
    report.set_skipped(step.skipped);
    report.set_compute_s(step.compute_s);
    report.set_wait_s(step.wait_s);
    report.set_parameter_bytes(parameter_bytes);
    const StageTimes& times = stage_metrics.times();
    v1::StageBreakdown* b = report.mutable_breakdown();
    b->set_forward_s(times.forward_s);
    b->set_backward_s(times.backward_s);
    b->set_optimizer_s(times.optimizer_s);
    b->set_receive_forward_s(times.receive_forward_s);
    b->set_receive_backward_s(times.receive_backward_s);
    b->set_send_forward_s(times.send_forward_s);
    b->set_send_backward_s(times.send_backward_s);
    b->set_exposed_allreduce_s(times.exposed_allreduce_s);
    b->set_last_step_bubble_ratio(times.last_step_bubble_ratio);
    b->set_last_step_s(times.last_step_s);
    for (v1::StepCommand c : jobspec::StepCommandsOf(step.commands_after)) {
      report.add_commands_after(c);
    }
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
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(5)));
    v1::ReportResponse response;
    if (coordinator_->ReportStageEnd(&ctx, end, &response).ok()) break;
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
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(5)));
  v1::DrainWorkerRequest request;
  request.set_worker_id(id());
  v1::DrainWorkerResponse response;
  if (!coordinator_->DrainWorker(&ctx, request, &response).ok() ||
      response.checkpoint_step() == 0) {
    return;
  }
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
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Milliseconds(500)));
    v1::ReportResponse response;
    (void)coordinator_->ReportStageEnd(&ctx, end, &response);
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
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(1)));
    v1::DeregisterWorkerRequest request;
    request.set_worker_id(id());
    v1::DeregisterWorkerResponse response;
    (void)coordinator_->DeregisterWorker(&ctx, request, &response);
  }
  if (server_) server_->Shutdown(In(absl::Seconds(2)));
}

Worker::~Worker() { Stop(); }

c10::Device TensorDevice(const std::string& device) {
  const int index = WorkerDeviceIndex(device);
  return index < 0 ? c10::Device(c10::DeviceType::CPU)
                   : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

int WorkerDeviceIndex(const std::string& device) {
  if (device == "cuda") return 0;
  int index = -1;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &index) && index >= 0) {
    return index;
  }
  return -1;
}

std::string CheckWorkerDevice(const std::string& device) {
  if (device == "cpu") return "";
  if (device != "cuda" && WorkerDeviceIndex(device) < 0) {
    return absl::StrCat("--device ", device, ": expected cpu, cuda or cuda:N");
  }
  const int visible = job::VisibleCudaDevices();
  if (WorkerDeviceIndex(device) >= visible) {
    return absl::StrCat("--device ", device, ": this process sees ", visible,
                        " CUDA device", visible == 1 ? "" : "s",
                        visible == 0 ? " (no GPU visible, or a LibTorch built without CUDA)" : "");
  }
  return "";
}

}  // namespace pipetrain::worker
