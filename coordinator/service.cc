#include "coordinator/service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/job_service.grpc.pb.h"
#include "rpc/listen.h"
#include "rpc/metrics_interceptor.h"
#include "rpc/security.h"
#include "rpc/status.h"

namespace pipetrain::coordinator {

namespace {

using rpc::ToGrpcStatus;

// The reply to a call: `result`'s value in `response`, or its error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(result).value();
  return grpc::Status::OK;
}

// No handler checks the token: the server's credentials refuse a call without it before it
// reaches any of them (rpc/security.h).
class JobServiceImpl final : public v1::JobService::Service {
 public:
  // `stopping`: set when the server stops; streams end at once then (not at the shutdown's
  // deadline), UNAVAILABLE so that a follower says the coordinator went.
  JobServiceImpl(Coordinator* c, const std::atomic<bool>* stopping) : c_(c), stopping_(stopping) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::Job* response) override {
    return Reply(c_->jobs().Submit(request->spec(), request->model_profile_json()), response);
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    return Reply(c_->jobs().Get(request->id()), response);
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    return Reply(c_->jobs().List(request->page_size(), request->page_token()), response);
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::Job* response) override {
    return Reply(c_->jobs().Cancel(request->id()), response);
  }
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                        grpc::ServerWriter<v1::Job>* writer) override {
    int64_t version = -1;
    while (!context->IsCancelled()) {
      if (stopping_->load()) return Stopping();
      auto next =
          c_->jobs().WaitForChange(request->id(), version, absl::Now() + absl::Milliseconds(100));
      if (!next.ok()) return ToGrpcStatus(next.status());
      if (next->second == version) continue;
      version = next->second;
      if (!writer->Write(next->first)) return grpc::Status::OK;
      const v1::JobState s = next->first.state();
      if (s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
          s == v1::JOB_STATE_CANCELLED) {
        return grpc::Status::OK;
      }
      // At most 10 updates a second per watcher: a job changes with every step report, and
      // a follower needs no more (the latest state is always sent, the end at once).
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return grpc::Status::OK;
  }
  grpc::Status StreamEvents(grpc::ServerContext* context, const v1::StreamEventsRequest* request,
                            grpc::ServerWriter<v1::JobEvent>* writer) override {
    int64_t after = request->after_seq();
    int64_t version = -1;
    while (!context->IsCancelled()) {
      if (stopping_->load()) return Stopping();
      auto events = c_->jobs().Events(request->job_id(), after);
      if (!events.ok()) return ToGrpcStatus(events.status());
      for (const v1::JobEvent& e : *events) {
        if (!writer->Write(e)) return grpc::Status::OK;
        after = e.seq();
      }
      // A full page: there may be more at once.
      if (static_cast<int64_t>(events->size()) == JobManager::kEventsPerCall) continue;
      if (!request->follow()) return grpc::Status::OK;
      auto job = c_->jobs().WaitForChange(request->job_id(), version,
                                          absl::Now() + absl::Milliseconds(100));
      if (!job.ok()) return ToGrpcStatus(job.status());
      version = job->second;
      const v1::JobState s = job->first.state();
      if (s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
          s == v1::JOB_STATE_CANCELLED) {
        // Whatever was appended with the end, then stop.
        for (bool more = true; more;) {
          auto last = c_->jobs().Events(request->job_id(), after);
          if (!last.ok()) break;
          for (const v1::JobEvent& e : *last) {
            if (!writer->Write(e)) return grpc::Status::OK;
            after = e.seq();
          }
          more = static_cast<int64_t>(last->size()) == JobManager::kEventsPerCall;
        }
        return grpc::Status::OK;
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    for (v1::WorkerInfo& w : c_->workers().Workers()) *response->add_workers() = std::move(w);
    return grpc::Status::OK;
  }
  grpc::Status SendCommand(grpc::ServerContext*, const v1::SendCommandRequest* request,
                           v1::SendCommandResponse* response) override {
    return Reply(c_->jobs().SendCommand(*request), response);
  }
  grpc::Status ListSteps(grpc::ServerContext*, const v1::ListStepsRequest* request,
                         v1::ListStepsResponse* response) override {
    absl::StatusOr<std::vector<StoredStep>> steps =
        c_->jobs().Steps(request->job_id(), request->after_step());
    if (!steps.ok()) return ToGrpcStatus(steps.status());
    for (const StoredStep& stored : *steps) {
      v1::CommittedStep* step = response->add_steps();
      step->set_step(stored.step);
      step->set_generation(stored.generation);
      step->set_has_loss(stored.has_loss);
      step->set_loss(stored.loss);
      step->set_unix_ms(stored.unix_ms);
      step->set_learning_rate(stored.learning_rate);
      step->set_has_grad_norm(stored.has_grad_norm);
      step->set_grad_norm(stored.grad_norm);
      step->set_has_eval(stored.has_eval);
      step->set_eval_loss(stored.eval_loss);
      step->set_eval_accuracy(stored.eval_accuracy);
    }
    return grpc::Status::OK;
  }

 private:
  static grpc::Status Stopping() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping");
  }

  Coordinator* c_;
  const std::atomic<bool>* stopping_;
};

class CoordinatorServiceImpl final : public v1::CoordinatorService::Service {
 public:
  explicit CoordinatorServiceImpl(Coordinator* c) : c_(c) {}
  grpc::Status RegisterWorker(grpc::ServerContext* ctx, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    return Reply(c_->workers().Register(*request, ctx->peer()), response);
  }
  grpc::Status DeregisterWorker(grpc::ServerContext* ctx,
                                const v1::DeregisterWorkerRequest* request,
                                v1::DeregisterWorkerResponse*) override {
    return ToGrpcStatus(c_->workers().Deregister(rpc::SessionOf(*ctx), *request));
  }
  grpc::Status DrainWorker(grpc::ServerContext* ctx, const v1::DrainWorkerRequest* request,
                           v1::DrainWorkerResponse* response) override {
    absl::StatusOr<v1::DrainWorkerResponse> r =
        c_->workers().DrainWorker(rpc::SessionOf(*ctx), *request);
    if (r.ok()) *response = *r;
    return ToGrpcStatus(r.status());
  }
  // Every other call names the worker's session (rpc::WorkerSession): the core checks that
  // it speaks only for that worker and its ranks.
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    return ToGrpcStatus(c_->workers().Heartbeat(rpc::SessionOf(*ctx), *request, response));
  }
  grpc::Status ReportStep(grpc::ServerContext* ctx, const v1::StepReport* request,
                          v1::ReportResponse* response) override {
    v1::StepReports one;
    *one.add_reports() = *request;
    return Reply(c_->reports().ReportSteps(rpc::SessionOf(*ctx), one), response);
  }
  grpc::Status ReportSteps(grpc::ServerContext* ctx, const v1::StepReports* request,
                           v1::ReportResponse* response) override {
    return Reply(c_->reports().ReportSteps(rpc::SessionOf(*ctx), *request), response);
  }
  grpc::Status ReportStageEnd(grpc::ServerContext* ctx, const v1::StageEnd* request,
                              v1::ReportResponse* response) override {
    return Reply(c_->reports().ReportStageEnd(rpc::SessionOf(*ctx), *request), response);
  }
  grpc::Status ReportStopped(grpc::ServerContext* ctx, const v1::StoppedRank* request,
                             v1::SurvivorInstruction* response) override {
    return Reply(c_->reports().ReportStopped(rpc::SessionOf(*ctx), *request), response);
  }

  // The rendezvous key-value store of a running job.
  grpc::Status KvSet(grpc::ServerContext* ctx, const v1::KvRequest* request,
                     v1::KvResponse*) override {
    return WithStore(*ctx, *request, [&](rendezvous::KeyValueStore& store) {
      return store.Set(request->key(), request->value());
    });
  }
  grpc::Status KvGet(grpc::ServerContext* ctx, const v1::KvRequest* request,
                     v1::KvResponse* response) override {
    return WithStore(*ctx, *request, [&](rendezvous::KeyValueStore& store) {
      const int64_t wait_ms = std::clamp<int64_t>(request->wait_ms(), 0, 10000);
      absl::StatusOr<std::string> value = store.Get(request->key(), absl::Milliseconds(wait_ms));
      if (absl::IsDeadlineExceeded(value.status())) return absl::OkStatus();  // found: false
      if (!value.ok()) return value.status();
      response->set_found(true);
      response->set_value(*value);
      return absl::OkStatus();
    });
  }
  grpc::Status KvAdd(grpc::ServerContext* ctx, const v1::KvRequest* request,
                     v1::KvResponse* response) override {
    return WithStore(*ctx, *request, [&](rendezvous::KeyValueStore& store) {
      absl::StatusOr<int64_t> value = store.Add(request->key(), request->delta());
      if (!value.ok()) return value.status();
      response->set_number(*value);
      return absl::OkStatus();
    });
  }
  grpc::Status KvCheck(grpc::ServerContext* ctx, const v1::KvRequest* request,
                       v1::KvResponse* response) override {
    return WithStore(*ctx, *request, [&](rendezvous::KeyValueStore& store) {
      absl::StatusOr<bool> all = store.Check({request->keys().begin(), request->keys().end()});
      if (!all.ok()) return all.status();
      response->set_found(*all);
      return absl::OkStatus();
    });
  }
  grpc::Status KvDelete(grpc::ServerContext* ctx, const v1::KvRequest* request,
                        v1::KvResponse*) override {
    return WithStore(*ctx, *request, [&](rendezvous::KeyValueStore& store) {
      return store.Delete(request->key());
    });
  }

 private:
  grpc::Status WithStore(const grpc::ServerContext& ctx, const v1::KvRequest& request,
                         const std::function<absl::Status(rendezvous::KeyValueStore&)>& call) {
    if (request.key().size() > WorkerManager::kKvKeyBytes || request.keys_size() > 1024) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a rendezvous key is at most 1 KiB, a check at most 1024 keys");
    }
    for (const std::string& key : request.keys()) {
      if (key.size() > WorkerManager::kKvKeyBytes) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "a rendezvous key is at most 1 KiB");
      }
    }
    auto store =
        c_->workers().Rendezvous(rpc::SessionOf(ctx), request.job_id(), request.generation());
    if (!store.ok()) return ToGrpcStatus(store.status());
    return ToGrpcStatus(call(**store));
  }

  Coordinator* c_;
};

constexpr int kMaxRequestBytes = static_cast<int>(WorkerManager::kKvValueBytes) + (64 << 10);

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator* coordinator, const ServerOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  auto credentials = rpc::MakeServerCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  server->job_service_ = std::make_unique<JobServiceImpl>(coordinator, &server->streams_stop_);
  server->coordinator_service_ = std::make_unique<CoordinatorServiceImpl>(coordinator);
  grpc::ServerBuilder builder;
  rpc::ListenExclusively(builder, options.listen, *credentials, &server->port_);
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->coordinator_service_.get());
  // No request needs more than a rendezvous value (1 MiB) and a little: a larger one is
  // refused by gRPC before it is buffered or parsed.
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  if (options.metrics != nullptr) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> timers;
    timers.push_back(rpc::MakeRpcMetricsInterceptorFactory(options.metrics));
    builder.experimental().SetInterceptorCreators(std::move(timers));
  }
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0) {
    return rpc::CannotListen("--listen", options.listen);
  }
  auto* health = server->server_->GetHealthCheckService();
  health->SetServingStatus("pipetrain.v1.JobService", true);
  health->SetServingStatus("pipetrain.v1.CoordinatorService", true);
  server->watchdog_ =
      std::thread([raw = server.get(), coordinator] { raw->WatchStateLoop(coordinator); });
  return server;
}

void CoordinatorServer::WatchStateLoop(Coordinator* coordinator) {
  bool serving = true;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; })) {
    const bool live = coordinator->StateLoopLive();
    if (live == serving) continue;
    serving = live;
    std::fprintf(stderr, "coordinator: %s\n",
                 live ? "the state loop runs again: serving"
                      : "the state loop has been blocked for over its limit: health says "
                        "NOT_SERVING");
    auto* health = server_->GetHealthCheckService();
    health->SetServingStatus(live);  // the server as a whole ("")
    health->SetServingStatus("pipetrain.v1.JobService", live);
    health->SetServingStatus("pipetrain.v1.CoordinatorService", live);
  }
}

void CoordinatorServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  streams_stop_ = true;  // followers' streams end within their next 100 ms wait
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace pipetrain::coordinator
