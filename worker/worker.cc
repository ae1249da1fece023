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
#include "jobspec/step_commands.h"
#include "rpc/listen.h"
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
#include "worker/advertised_address.h"
#include "worker/data_roots.h"
#include "worker/stage_metrics.h"
#include "worker/step_reporter.h"

namespace pipetrain::worker {
namespace {

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

Worker::Worker(WorkerOptions options, std::shared_ptr<const Clock> clock)
    : options_(std::move(options)), clock_(std::move(clock)), slot_(clock_), held_(clock_) {}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    const WorkerOptions& options, absl::Duration register_timeout,
    std::shared_ptr<CoordinatorClient> coordinator, std::shared_ptr<const Clock> clock) {
  absl::StatusOr<AdvertisedAddress> advertised =
      ChooseAdvertisedAddress(options.listen, options.advertise_address, options.iface);
  if (!advertised.ok()) return advertised.status();
  std::unique_ptr<Worker> w(
      new Worker(options, clock != nullptr ? std::move(clock) : std::make_shared<RealClock>()));
  // NCCL's bootstrap and sockets on the interface its peers reach (unless told otherwise).
  if (!advertised->iface.empty() && job::TensorDeviceOf(options.device).is_cuda()) {
    setenv("NCCL_SOCKET_IFNAME", advertised->iface.c_str(), /*overwrite=*/0);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = rpc::MakeServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  // Every call after registering carries this worker's session (rpc::WorkerSession).
  auto channel = rpc::MakeChannel(options.coordinator, options.security, w->session_);
  if (!channel.ok()) return channel.status();
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen = ListenAddressFor(options.listen, *advertised);
  rpc::ListenExclusively(builder, listen, *credentials, &port);
  w->service_ = std::make_unique<WorkerServiceAdapter>(w.get(), w->command_key_, &w->held_);
  builder.RegisterService(w->service_.get());
  w->server_ = builder.BuildAndStart();
  if (!w->server_ || port == 0) {
    return rpc::CannotListen("--listen", listen);
  }
  w->address_ = JoinHostPort(advertised->host, port);
  if (!options.metrics_listen.empty()) {
    auto endpoint = metrics::MetricsEndpoint::Start(options.metrics_listen, &w->metrics_);
    if (!endpoint.ok()) return endpoint.status();
    w->metrics_endpoint_ = *std::move(endpoint);
  }
  w->metrics_
      .GetGauge("pipetrain_build_info", "1, labelled with the build's version.",
                {"version", "daemon"}, {PIPETRAIN_VERSION, "worker"})
      .Set(1);
  w->metrics_.AddCollector(
      "pipetrain_worker_memory_bytes",
      "This worker process's resident memory now (resident) and its high-water mark (peak); "
      "the tensor storage on its device (CPU or GPU) counted at the allocator now (tensors) "
      "and the most since its current or last rank was assigned (tensors_peak); the survivors' "
      "state it holds for a job's next generation (held_state).",
      {"kind"}, [tensors_on = job::TensorDeviceOf(options.device), held = &w->held_] {
        std::vector<metrics::CollectedSample> samples = {
            {{"resident"}, static_cast<double>(ResidentMemoryBytes())},
            {{"peak"}, static_cast<double>(PeakResidentMemoryBytes())},
            {{"held_state"}, static_cast<double>(held->bytes())}};
        const int64_t now = memory::TensorBytesInUseOn(tensors_on);
        const int64_t peak = memory::PeakTensorBytesOn(tensors_on);
        // Known on the CPU once the counter is installed; on a GPU where LibTorch has CUDA.
        const bool known =
            tensors_on.is_cpu() ? memory::CountingTensorMemory() : now >= 0 && peak >= 0;
        if (known) {
          samples.push_back({{"tensors"}, static_cast<double>(now)});
          samples.push_back({{"tensors_peak"}, static_cast<double>(peak)});
        }
        return samples;
      });
  w->coordinator_ = coordinator != nullptr
                        ? std::move(coordinator)
                        : MakeGrpcCoordinatorClient(v1::CoordinatorService::NewStub(*channel));
  w->host_ = std::make_unique<StageHost>(
      StageHostOptions{options.device, advertised->host, options.data_roots, w->address_,
                       options.security},
      w->coordinator_, &w->metrics_, &w->slot_, &w->held_);
  if (absl::Status s = w->Register(w->clock_->Now() + register_timeout); !s.ok()) return s;
  w->heartbeat_thread_ = std::thread([raw = w.get()] { raw->HeartbeatLoop(); });
  // Ready last: a readiness probe that passes means /metrics answers and the coordinator
  // knows this worker.
  w->server_->GetHealthCheckService()->SetServingStatus("pipetrain.v1.WorkerService", true);
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
  request.set_host(options_.host);
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
      lease_ = absl::Milliseconds(std::max<int64_t>(0, response->lease_ms()));
      heard_at_ = clock_->Now();
      std::fprintf(stderr, "pipetrain-worker: registered as %s with %s (serving on %s)\n",
                   id_.c_str(), options_.coordinator.c_str(), address_.c_str());
      return absl::OkStatus();
    }
    if (const absl::Status& refused = last;
        absl::IsUnauthenticated(refused) || absl::IsPermissionDenied(refused)) {
      // Retrying cannot help: the token is wrong or missing.
      return absl::Status(
          refused.code(),
          absl::StrCat("the coordinator at ", options_.coordinator,
                       " refused to register this worker (",
                       absl::StatusCodeToString(refused.code()), ": ", refused.message(),
                       "); give its token with --token-file or PIPETRAIN_TOKEN"));
    }
    if (absl::IsInvalidArgument(last) || absl::IsFailedPrecondition(last)) {
      // Retrying cannot help either: the coordinator refuses what this worker says of itself
      // (an address nobody else can reach, say).
      return absl::Status(last.code(),
                          absl::StrCat("the coordinator at ", options_.coordinator,
                                       " refused to register this worker: ", last.message()));
    }
    if (clock_->Now() + absl::Milliseconds(200) >= deadline) break;
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
  // At a fixed rate: the next heartbeat is due an interval after the last was sent, not after
  // its answer came (a slow answer would otherwise stretch the gap the coordinator sees
  // towards the two intervals after which it takes this worker for lost).
  absl::Time due = clock_->Now() + heartbeat_interval_;
  while (!stopping_) {
    const absl::Duration wait = std::max(absl::ZeroDuration(), due - clock_->Now());
    cv_.wait_for(lock, std::chrono::microseconds(absl::ToInt64Microseconds(wait)),
                 [this] { return stopping_; });
    if (stopping_) break;
    v1::HeartbeatRequest request;
    request.set_worker_id(id_);
    const StageSlot::Occupant running = slot_.occupant();
    request.set_job_id(running.job_id);
    request.set_rank(running.rank);
    request.set_generation(running.generation);
    const StageSlot::Activity activity = slot_.activity();
    request.set_action(activity.action);
    request.set_waiting_for(activity.waiting_for);
    // Under a lease, an answer is waited for until the lease would end (at least an interval).
    const absl::Time sent = clock_->Now();
    due = sent + heartbeat_interval_;
    const absl::Duration deadline = lease_ > absl::ZeroDuration()
                                        ? std::max(heard_at_ + lease_ - sent, heartbeat_interval_)
                                        : absl::Seconds(2);
    lock.unlock();
    v1::HeartbeatResponse response;
    const absl::Status s = coordinator_->Heartbeat(request, deadline, &response);
    if (s.ok()) {
      held_.KeepOnly({response.held_state_jobs().begin(), response.held_state_jobs().end()}, sent);
    }
    lock.lock();
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) {
      heard_at_ = sent;  // the coordinator answered (whatever it said)
    } else if (lease_ > absl::ZeroDuration() && clock_->Now() - heard_at_ >= lease_) {
      LeaseExpired();
    }
    if (absl::IsNotFound(s) && !stopping_) {
      // The coordinator restarted (or gave this worker up): whatever ran is orphaned, and the
      // old id and session are void until it has registered again.
      slot_.StopAny("the coordinator no longer knows this worker");
      id_.clear();
      session_->Set("");
      lock.unlock();
      absl::Status r = Register(clock_->Now() + absl::Seconds(5));
      lock.lock();
      if (!r.ok()) {
        std::fprintf(stderr, "pipetrain-worker: %s\n", std::string(r.message()).c_str());
      }
    }
  }
}

void Worker::LeaseExpired() {
  const StageSlot::Occupant running = slot_.occupant();
  if (running.job_id.empty() || running.ending || !running.stop_reason.empty()) return;
  const std::string why =
      absl::StrCat("no heartbeat answered by the coordinator at ", options_.coordinator, " for ",
                   absl::FormatDuration(clock_->Now() - heard_at_), " (this worker's lease is ",
                   absl::FormatDuration(lease_),
                   "): the coordinator takes it for lost and may run its rank "
                   "elsewhere");
  std::fprintf(stderr, "pipetrain-worker: %s: stopping rank %d of %s\n", why.c_str(), running.rank,
               running.job_id.c_str());
  slot_.StopAny(why);
}

absl::Status Worker::Assign(const v1::StageAssignment& assignment) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    // The coordinator may assign a rank as soon as it has registered this worker, before the
    // answer to RegisterWorker (its id and session) has arrived here: wait for that too.
    cv_.wait_for(lock, std::chrono::seconds(5), [this] { return !id_.empty() || stopping_; });
    if (id_.empty() && !stopping_) {
      return absl::FailedPreconditionError("not registered yet");
    }
  }
  return slot_.Start(assignment.job_id(), assignment.rank(), assignment.generation(),
                     kEndingPatience, [this, assignment] { host_->Run(assignment, id()); });
}

void Worker::StopRank(const v1::StopStageRequest& request) {
  slot_.Stop(request.job_id(), request.generation(), absl::StrCat("stopped: ", request.reason()));
}

absl::StatusOr<int64_t> Worker::ScheduleCommand(const v1::SendCommandRequest& request) {
  const uint32_t command = jobspec::StepCommandBit(request.command());
  if (command == 0) return absl::InvalidArgumentError("no step command given");
  std::shared_ptr<control::StepCommandQueue> queue = slot_.CommandQueueOf(request.job_id());
  if (!queue) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker does not run stage 0 of replica 0 of ", request.job_id(), " (now)"));
  }
  return queue->Schedule(command, request.step());
}

void Worker::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || draining_) return;
    draining_ = true;
  }
  slot_.Close("the worker is draining");  // no new assignment from here on
  const StageSlot::Occupant running = slot_.occupant();
  if (running.job_id.empty() || running.ending || id().empty() || !coordinator_) return;
  v1::DrainWorkerRequest request;
  request.set_worker_id(id());
  const absl::StatusOr<v1::DrainWorkerResponse> drained = coordinator_->Drain(request);
  if (!drained.ok() || drained->checkpoint_step() == 0) return;
  std::fprintf(stderr,
               "pipetrain-worker: draining: %s is checkpointed before step %lld and "
               "restarts without this worker; waiting for that (at most %s)\n",
               running.job_id.c_str(), static_cast<long long>(drained->checkpoint_step()),
               absl::FormatDuration(kDrainTimeout).c_str());
  slot_.WaitUntilNotRunning(running.job_id, clock_->Now() + kDrainTimeout);
}

void Worker::Stop() {
  constexpr char kWhy[] = "the worker is shutting down";
  Drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();  // no heartbeat from here on
  slot_.Close(kWhy);
  // The coordinator hears why the rank ends before its peers can report losing it (their
  // "connection reset" would otherwise be taken for the job's cause). The stage's own report
  // follows and changes nothing.
  const StageSlot::Occupant running = slot_.occupant();
  const std::string worker_id = id();
  if (coordinator_ && !running.job_id.empty() && !running.ending && !worker_id.empty()) {
    v1::StageEnd end;
    end.set_worker_id(worker_id);
    end.set_job_id(running.job_id);
    end.set_rank(running.rank);
    end.set_generation(running.generation);
    end.set_error(kWhy);
    (void)coordinator_->ReportStageEnd(end, absl::Milliseconds(500));
  }
  slot_.Shutdown(kWhy);  // stops the rank and waits for its end to be reported
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
