// coordinator_capacity's side of the cluster: its own coordinator, the simulated workers'
// registrations, the job over them and its end. See coordinator_capacity_cluster.h.
#include "bench/coordinator_capacity_cluster.h"

#include <signal.h>
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

OwnCoordinator::OwnCoordinator(const std::string& binary) {
  dir_ = fs::temp_directory_path() / ("coordinator_capacity_" + std::to_string(getpid()));
  fs::create_directories(dir_);
  const fs::path log = dir_ / "coordinator.log", port_file = dir_ / "coordinator.port";
  pid_ = pipetrain::client::SpawnDaemon({binary, "--listen", "127.0.0.1:0", "--db",
                              (dir_ / "jobs.db").string(), "--port-file", port_file.string()},
                             log.string(), SIGTERM);
  if (pid_ <= 0) Die("cannot start " + binary);
  absl::StatusOr<std::string> address =
      pipetrain::client::WaitForPortFile(port_file.string(), pid_, absl::Seconds(30), log.string());
  if (!address.ok()) Die("the coordinator did not start: " + std::string(address.status().message()));
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

void RegisterSimulatedWorkers(v1::CoordinatorService::Stub& coordinator,
                              const std::string& target, int port, int n, Cluster& cluster) {
  if (n > 250 * 254) Die("at most " + std::to_string(250 * 254) + " simulated workers");
  cluster.last_heartbeat.reset(new std::atomic<int64_t>[n]);
  cluster.next_step.reset(new int64_t[n]);
  cluster.rank_mu.reset(new std::mutex[n]);
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::RegisterWorkerRequest request;
    request.set_address(SimulatedWorkerAddress(i, port));
    request.set_command_key(pipetrain::rpc::RandomKey());
    request.set_device("cpu");
    request.set_name("coordinator_capacity simulated worker " + std::to_string(i));
    v1::RegisterWorkerResponse response;
    grpc::Status s = coordinator.RegisterWorker(&ctx, request, &response);
    if (!s.ok()) Die("RegisterWorker at " + target + ": " + s.error_message());
    cluster.worker_ids.push_back(response.worker_id());
    cluster.sessions.push_back(response.session());
    cluster.heartbeat_ms = response.heartbeat_interval_ms();
    cluster.last_heartbeat[i].store(NowNs());
    cluster.next_step[i] = 0;
  }
}

// Submits one job whose ranks take every simulated worker and waits until all are assigned;
// returns its id.
std::string SubmitJobOverAll(v1::JobService::Stub& jobs, FakeWorkerService& service,
                             int stages, int n) {
  v1::SubmitJobRequest request;
  v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("coordinator_capacity");
  spec->mutable_model()->set_name("gpt");
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
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (service.assigned() < n && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (service.assigned() < n) {
    Die("only " + std::to_string(service.assigned()) + " of " + std::to_string(n) +
        " ranks of " + job.id() +
        " were assigned to the simulated workers (does the coordinator have other idle "
        "workers, or too few of ours?)");
  }
  return job.id();
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
