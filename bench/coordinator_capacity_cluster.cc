// coordinator_capacity's side of the cluster: its own coordinator, the simulated workers'
// registrations, the job over them and its end. See coordinator_capacity_cluster.h.
#include "bench/coordinator_capacity_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/coordinator_capacity_options.h"
#include "client/daemon_process.h"
#include "runtime/base/subprocess.h"

namespace pipetrain::bench::capacity {
namespace {

std::string Token() {
  const char* t = std::getenv("PIPETRAIN_TOKEN");
  return t ? t : "";
}

}  // namespace

namespace {

class FakeWorkerService final : public v1::WorkerService::Service {
 public:
  explicit FakeWorkerService(int assigned_fd) : assigned_fd_(assigned_fd) {}
  grpc::Status AssignStage(grpc::ServerContext*, const v1::StageAssignment*,
                           v1::AssignResponse*) override {
    const char one = 1;
    (void)!write(assigned_fd_, &one, 1);
    return grpc::Status::OK;
  }
  grpc::Status StopStage(grpc::ServerContext*, const v1::StopStageRequest*,
                         v1::AssignResponse*) override {
    return grpc::Status::OK;
  }

 private:
  const int assigned_fd_;
};

}  // namespace

FakeWorkers::FakeWorkers() {
  int port_pipe[2], assigned_pipe[2];
  if (pipe(port_pipe) != 0 || pipe(assigned_pipe) != 0) Die("pipe");
  pid_ = fork();
  if (pid_ < 0) Die("fork");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // Below the coordinator and the simulated workers' heartbeats, on a machine of few cores:
    // answering assignments is not what is measured.
    (void)!nice(10);
    close(port_pipe[0]);
    close(assigned_pipe[0]);
    FakeWorkerService service(assigned_pipe[1]);
    grpc::ServerBuilder builder;
    int port = 0;
    // On every address of the host: each simulated worker registers an address of its own
    // on loopback (127.0.x.y, SimulatedWorkerAddress), as distinct workers do.
    builder.AddListeningPort("0.0.0.0:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server) port = 0;
    (void)!write(port_pipe[1], &port, sizeof port);
    close(port_pipe[1]);
    if (server) server->Wait();  // until killed
    _exit(0);
  }
  close(port_pipe[1]);
  close(assigned_pipe[1]);
  if (read(port_pipe[0], &port_, sizeof port_) != sizeof port_ || port_ == 0) {
    Die("cannot serve the simulated workers' WorkerService");
  }
  close(port_pipe[0]);
  assigned_fd_ = assigned_pipe[0];
  fcntl(assigned_fd_, F_SETFL, fcntl(assigned_fd_, F_GETFL) | O_NONBLOCK);
}

FakeWorkers::~FakeWorkers() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (assigned_fd_ >= 0) close(assigned_fd_);
}

int FakeWorkers::assigned() {
  char buffer[4096];
  ssize_t got;
  while ((got = read(assigned_fd_, buffer, sizeof buffer)) > 0) assigned_ += static_cast<int>(got);
  return assigned_;
}

OwnCoordinator::OwnCoordinator(const std::string& binary) {
  dir_ = fs::temp_directory_path() / ("coordinator_capacity_" + std::to_string(getpid()));
  fs::create_directories(dir_);
  const fs::path log = dir_ / "coordinator.log", port_file = dir_ / "coordinator.port";
  pid_ = pipetrain::client::SpawnDaemon(
      {binary, "--listen", "127.0.0.1:0", "--db", (dir_ / "jobs.db").string(), "--port-file",
       port_file.string()},
      log.string(), SIGTERM);
  if (pid_ <= 0) Die("cannot start " + binary);
  absl::StatusOr<std::string> address =
      pipetrain::client::WaitForPortFile(port_file.string(), pid_, absl::Seconds(30), log.string());
  if (!address.ok())
    Die("the coordinator did not start: " + std::string(address.status().message()));
  address_ = *address;
}

OwnCoordinator::~OwnCoordinator() {
  pipetrain::subprocess::Stop(pid_, SIGTERM, absl::Seconds(10));
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void Prepare(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  static const std::string token = Token();
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
}

// A channel with its own connection (gRPC otherwise shares one per target in a process).
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

double MonotonicSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string SimulatedWorkerAddress(int i, int port) {
  return "127.0." + std::to_string(1 + i / 250) + "." + std::to_string(1 + i % 250) + ":" +
         std::to_string(port);
}

void Cluster::Allocate(int n) {
  if (n > 250 * 254) Die("at most " + std::to_string(250 * 254) + " simulated workers");
  registered.reset(new std::atomic<bool>[n]);
  last_heartbeat.reset(new std::atomic<int64_t>[n]);
  next_step.reset(new int64_t[n]);
  rank_mu.reset(new std::mutex[n]);
  worker_ids.assign(n, "");
  sessions.assign(n, "");
  for (int i = 0; i < n; ++i) {
    registered[i].store(false);
    last_heartbeat[i].store(0);
    next_step[i] = 0;
  }
}

void RegisterSimulatedWorkers(const std::string& target, int port, int n, double per_s,
                              Cluster& cluster) {
  constexpr int kThreads = 8;  // each its own connection
  std::atomic<int64_t> heartbeat_ms{1000};
  const int64_t start_ns = NowNs();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
      for (int i = t; i < n; i += kThreads) {
        if (per_s > 0) {  // worker i starts at i / per_s
          const int64_t wait = start_ns + static_cast<int64_t>(i / per_s * 1e9) - NowNs();
          if (wait > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(wait));
        }
        grpc::ClientContext ctx;
        Prepare(&ctx);
        v1::RegisterWorkerRequest request;
        request.set_address(SimulatedWorkerAddress(i, port));
        request.set_command_key(pipetrain::rpc::RandomKey());
        request.set_device("cpu");
        request.set_name("coordinator_capacity simulated worker " + std::to_string(i));
        v1::RegisterWorkerResponse response;
        grpc::Status s = stub->RegisterWorker(&ctx, request, &response);
        if (!s.ok()) Die("RegisterWorker at " + target + ": " + s.error_message());
        cluster.worker_ids[i] = response.worker_id();
        cluster.sessions[i] = response.session();
        heartbeat_ms.store(response.heartbeat_interval_ms());
        cluster.last_heartbeat[i].store(NowNs());
        cluster.registered[i].store(true);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  cluster.heartbeat_ms = heartbeat_ms.load();
}

Keepalive::Keepalive(const std::string& target, Cluster& cluster, int threads) : cluster_(cluster) {
  for (int t = 0; t < threads; ++t) {
    threads_.emplace_back([this, target, t, threads] { Loop(target, t, threads); });
  }
}

Keepalive::~Keepalive() {
  stopping_.store(true);
  for (std::thread& t : threads_) t.join();
  std::fprintf(stderr, "keepalive: the longest a worker waited for its heartbeat: %.0f ms\n",
               longest_gap_ns_.load() / 1e6);
}

void Keepalive::SetJob(const std::string& job_id, const std::vector<int>& rank_of_worker) {
  std::lock_guard<std::mutex> lock(mu_);
  job_id_ = job_id;
  rank_of_worker_ = rank_of_worker;
}

void Keepalive::Loop(const std::string& target, int t, int threads) {
  auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
  const int n = static_cast<int>(cluster_.worker_ids.size());
  while (!stopping_.load()) {
    std::string job_id;
    std::vector<int> rank_of_worker;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_id = job_id_;
      rank_of_worker = rank_of_worker_;
    }
    // Registration answers with the interval; 1 s until then.
    const int64_t due_ns = std::max<int64_t>(cluster_.heartbeat_ms, 1) * 800000;
    for (int i = t; i < n && !stopping_.load() && !paused_.load(); i += threads) {
      if (!cluster_.registered[i].load() || NowNs() - cluster_.last_heartbeat[i].load() < due_ns) {
        continue;
      }
      int64_t gap = NowNs() - cluster_.last_heartbeat[i].load();
      for (int64_t seen = longest_gap_ns_.load();
           gap > seen && !longest_gap_ns_.compare_exchange_weak(seen, gap);) {
      }
      grpc::ClientContext ctx;
      Prepare(&ctx);
      cluster_.As(i, &ctx);
      v1::HeartbeatRequest request;
      request.set_worker_id(cluster_.worker_ids[i]);
      const bool busy = !job_id.empty() && i < static_cast<int>(rank_of_worker.size());
      request.set_job_id(busy ? job_id : "");
      request.set_rank(busy ? rank_of_worker[i] : -1);
      v1::HeartbeatResponse response;
      const int64_t sent = NowNs();
      (void)stub->Heartbeat(&ctx, request, &response);
      cluster_.last_heartbeat[i].store(NowNs());
      gap = NowNs() - sent;
      for (int64_t seen = longest_call_ns_.load();
           gap > seen && !longest_call_ns_.compare_exchange_weak(seen, gap);) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Submits one job whose ranks take every simulated worker and waits until all are assigned;
// returns its id.
std::string SubmitJobOverAll(v1::JobService::Stub& jobs, int stages, int n) {
  v1::SubmitJobRequest request;
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("coordinator_capacity");
  spec->mutable_model()->set_name("gpt");
  spec->mutable_model()->set_n_layers(std::max(4, stages));  // a layer at least per stage
  spec->set_schedule("1f1b");
  spec->set_stages(stages);
  spec->set_replicas(n / stages);
  spec->set_microbatches(std::max(stages, 4));
  // Long enough never to finish: the coordinator logs an event every steps/10 steps.
  spec->set_steps(1000000000);
  grpc::ClientContext ctx;
  Prepare(&ctx, 30);
  v1::Job job;
  grpc::Status s = jobs.SubmitJob(&ctx, request, &job);
  if (!s.ok()) Die("SubmitJob: " + s.error_message());
  return job.id();
}

void WaitUntilAssigned(FakeWorkers& service, const std::string& job_id, int n) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (service.assigned() < n && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (service.assigned() < n) {
    Die("only " + std::to_string(service.assigned()) + " of " + std::to_string(n) + " ranks of " +
        job_id +
        " were assigned to the simulated workers (does the coordinator have other idle "
        "workers, or too few of ours?)");
  }
}

void MapRanks(v1::JobService::Stub& jobs, const std::string& job_id, Cluster& cluster) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::GetJobRequest request;
  request.set_id(job_id);
  v1::Job job;
  grpc::Status s = jobs.GetJob(&ctx, request, &job);
  if (!s.ok()) Die("GetJob: " + s.error_message());
  const int n = static_cast<int>(cluster.worker_ids.size());
  cluster.worker_of_rank.assign(job.stage_status_size(), -1);
  cluster.rank_of_worker.assign(n, -1);
  for (int r = 0; r < job.stage_status_size(); ++r) {
    const std::string& id = job.stage_status(r).worker_id();
    const auto it = std::find(cluster.worker_ids.begin(), cluster.worker_ids.end(), id);
    if (it == cluster.worker_ids.end()) {
      Die("rank " + std::to_string(r) + " runs on " + id + ", not one of ours");
    }
    const int w = static_cast<int>(it - cluster.worker_ids.begin());
    cluster.worker_of_rank[r] = w;
    cluster.rank_of_worker[w] = r;
  }
}

// Cancels the job and ends every rank, so the simulated workers are idle again.
void EndEveryRank(v1::JobService::Stub& jobs, v1::CoordinatorService::Stub& coordinator,
                  const Cluster& cluster, int n) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::CancelJobRequest request;
  request.set_id(cluster.job_id);
  v1::Job job;
  grpc::Status s = jobs.CancelJob(&ctx, request, &job);
  if (!s.ok()) std::fprintf(stderr, "CancelJob: %s\n", s.error_message().c_str());
  for (int r = 0; r < n && r < static_cast<int>(cluster.worker_of_rank.size()); ++r) {
    const int w = cluster.worker_of_rank[r];
    grpc::ClientContext end_ctx;
    Prepare(&end_ctx);
    cluster.As(w, &end_ctx);
    v1::StageEnd end;
    end.set_worker_id(cluster.worker_ids[w]);
    end.set_job_id(cluster.job_id);
    end.set_rank(r);
    end.set_ok(false);
    end.set_error("coordinator_capacity finished");
    v1::ReportResponse response;
    (void)coordinator.ReportStageEnd(&end_ctx, end, &response);
  }
}

}  // namespace pipetrain::bench::capacity
