// coordinator_capacity: how many worker RPCs a pipetrain-coordinator answers, and how fast.
//
// Simulates N workers against a running coordinator (--coordinator HOST:PORT), or against
// one it starts itself (--start-coordinator PATH: port 0, a fresh SQLite file in a temporary
// folder, killed at the end):
//   1. serves one WorkerService (AssignStage and StopStage answer OK and do nothing) and
//      registers N workers with it (RegisterWorker, all at that one address);
//   2. submits one job of `--stages` stages x N / stages replicas, so that the coordinator
//      assigns one rank to each simulated worker (it needs every rank assigned before it
//      accepts step reports: ReportStep is refused for a job that is not running or a rank
//      out of range), and waits until all N AssignStage calls arrived;
//   3. for each client thread count T in --threads, for --seconds each, measures
//        Heartbeat   worker i (round robin over the N), with its job and rank, as a busy
//                    worker sends it every heartbeat interval;
//        ReportStep  rank r (round robin), the next step of that rank, with compute/wait
//                    totals and end time, and the loss on last-stage ranks, as a worker
//                    sends it after every step;
//        mixed       both, alternating, on every thread;
//      each thread with its own channel (its own TCP connection, as every worker has).
//      Printed: calls answered per second (all threads), and p50 / p99 latency of one call
//      as the client sees it (send to reply, including this process's own scheduling);
//   4. cancels the job and reports every rank's end, so the workers go idle again.
// Heartbeats that keep the simulated workers alive while a phase does not cover them are
// sent from a separate thread, at most once per heartbeat interval per worker (as real
// workers do), and are not counted. The simulated workers are in this process and use the
// same cores as the coordinator: on a 2-core machine the numbers are a lower bound.
// With $PIPETRAIN_TOKEN set, every call carries it ("authorization: Bearer ...").
//
//   coordinator_capacity --coordinator 127.0.0.1:7070 [--workers 64] [--stages 2]
//                        [--threads 1,8] [--seconds 3]
//   coordinator_capacity --start-coordinator build-bench/coordinator/pipetrain-coordinator
// Or bench/coordinator_capacity.sh, which starts a coordinator on a temporary database.
// Prints a markdown table on stdout. Against a coordinator of its own: the coordinator must
// have no other idle workers (the job's ranks must all come here).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/daemon_process.h"
#include "runtime/base/subprocess.h"
#include "pipetrain/v1/coordinator_service.grpc.pb.h"
#include "pipetrain/v1/job_service.grpc.pb.h"
#include "pipetrain/v1/worker_service.grpc.pb.h"
#include "rpc/security.h"


namespace {

namespace v1 = pipetrain::v1;
namespace rpc = pipetrain::rpc;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "coordinator_capacity: %s\n", message.c_str());
  std::exit(1);
}

struct Options {
  std::string coordinator;
  std::string start_coordinator;
  int workers = 64;
  int stages = 2;
  std::vector<int> threads = {1, 8};
  double seconds = 3;
};

Options ParseArgs(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) Die(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--coordinator") {
      o.coordinator = value(i);
    } else if (a == "--start-coordinator") {
      o.start_coordinator = value(i);
    } else if (a == "--workers") {
      o.workers = std::atoi(value(i).c_str());
    } else if (a == "--stages") {
      o.stages = std::atoi(value(i).c_str());
    } else if (a == "--seconds") {
      o.seconds = std::atof(value(i).c_str());
    } else if (a == "--threads") {
      o.threads.clear();
      std::stringstream list(value(i));
      for (std::string t; std::getline(list, t, ',');) o.threads.push_back(std::atoi(t.c_str()));
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "coordinator_capacity (--coordinator HOST:PORT | --start-coordinator PATH)\n"
          "    [--workers 64] [--stages 2] [--threads 1,8] [--seconds 3]\n"
          "Registers N simulated workers, gets a job assigned to them, and measures\n"
          "Heartbeat and ReportStep throughput and latency from T client threads.\n");
      std::exit(0);
    } else {
      Die("unknown argument " + a + " (see --help)");
    }
  }
  if (o.coordinator.empty() == o.start_coordinator.empty()) {
    Die("give exactly one of --coordinator HOST:PORT and --start-coordinator PATH");
  }
  if (o.workers < 1 || o.stages < 1 || o.workers % o.stages != 0) {
    Die("--workers must be a positive multiple of --stages");
  }
  if (o.seconds <= 0 || o.threads.empty()) Die("--seconds and --threads must be positive");
  for (int t : o.threads) {
    if (t < 1) Die("--threads: every count must be >= 1");
  }
  return o;
}

// A pipetrain-coordinator of our own, on a fresh database; killed by the destructor.
class OwnCoordinator {
 public:
  explicit OwnCoordinator(const std::string& binary) {
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
  ~OwnCoordinator() {
    pipetrain::subprocess::Stop(pid_, SIGTERM, absl::Seconds(10));
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& address() const { return address_; }

 private:
  fs::path dir_;
  pid_t pid_ = -1;
  std::string address_;
};

// The simulated workers' one WorkerService: takes every assignment, does nothing.
class FakeWorkerService final : public v1::WorkerService::Service {
 public:
  grpc::Status AssignStage(grpc::ServerContext*, const v1::StageAssignment* request,
                           v1::AssignResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    job_id_ = request->job_id();
    ++assigned_;
    return grpc::Status::OK;
  }
  grpc::Status StopStage(grpc::ServerContext*, const v1::StopStageRequest*,
                         v1::AssignResponse*) override {
    return grpc::Status::OK;
  }
  int assigned() {
    std::lock_guard<std::mutex> lock(mu_);
    return assigned_;
  }

 private:
  std::mutex mu_;
  std::string job_id_;
  int assigned_ = 0;
};

std::string Token() {
  const char* t = std::getenv("PIPETRAIN_TOKEN");
  return t ? t : "";
}

void Prepare(grpc::ClientContext* ctx, double seconds = 5) {
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

struct Cluster {
  std::vector<std::string> worker_ids;
  std::vector<std::string> sessions;  // each worker's own credential (rpc::WorkerSession)
  std::string job_id;
  int stages = 0;
  int64_t heartbeat_ms = 1000;
  // Per worker: when its last heartbeat was sent (ns since the clock's epoch).
  std::unique_ptr<std::atomic<int64_t>[]> last_heartbeat;
  // Per rank: the next step to report, under the rank's lock (the coordinator takes a rank's
  // steps only in order, so two threads must not race for one rank).
  std::unique_ptr<int64_t[]> next_step;
  std::unique_ptr<std::mutex[]> rank_mu;
  // Sends as worker i.
  void As(int i, grpc::ClientContext* ctx) const {
    ctx->AddMetadata(rpc::WorkerSession::kHeader, sessions[i]);
  }
};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

enum class Kind { kHeartbeat, kReportStep, kMixed };

struct PhaseResult {
  int64_t calls = 0, errors = 0;
  double seconds = 0;
  std::vector<double> latencies_us;
  std::string first_error;
};

PhaseResult RunPhase(const std::string& target, Cluster& cluster, Kind kind, int threads,
                     double seconds) {
  const int n = static_cast<int>(cluster.worker_ids.size());
  std::vector<PhaseResult> per_thread(threads);
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
      PhaseResult& r = per_thread[t];
      r.latencies_us.reserve(1 << 16);
      // Connect before the clock starts.
      {
        grpc::ClientContext ctx;
        Prepare(&ctx);
        cluster.As(t % n, &ctx);
        v1::HeartbeatRequest hb;
        hb.set_worker_id(cluster.worker_ids[t % n]);
        v1::HeartbeatResponse resp;
        (void)stub->Heartbeat(&ctx, hb, &resp);
      }
      while (!go.load()) std::this_thread::yield();
      for (int64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
        const int i = static_cast<int>((t + k * threads) % n);  // worker i runs rank i
        const bool heartbeat = kind == Kind::kHeartbeat || (kind == Kind::kMixed && k % 2 == 0);
        grpc::ClientContext ctx;
        Prepare(&ctx);
        cluster.As(i, &ctx);
        grpc::Status s;
        const auto start = Clock::now();
        if (heartbeat) {
          v1::HeartbeatRequest request;
          request.set_worker_id(cluster.worker_ids[i]);
          request.set_job_id(cluster.job_id);
          request.set_rank(i);
          v1::HeartbeatResponse response;
          s = stub->Heartbeat(&ctx, request, &response);
          cluster.last_heartbeat[i].store(NowNs(), std::memory_order_relaxed);
        } else {
          v1::StepReport report;
          report.set_worker_id(cluster.worker_ids[i]);
          report.set_job_id(cluster.job_id);
          report.set_rank(i);
          std::lock_guard<std::mutex> rank_lock(cluster.rank_mu[i]);
          const int64_t step = cluster.next_step[i]++;
          report.set_step(step);
          if (i % cluster.stages == cluster.stages - 1) {
            report.set_has_loss(true);
            report.set_loss(2.0);
          }
          report.set_compute_s(0.02 * (step + 1));
          report.set_wait_s(0.005 * (step + 1));
          report.set_end_s(MonotonicSeconds());
          v1::ReportResponse response;
          s = stub->ReportStep(&ctx, report, &response);
          if (s.ok() && response.stop()) {
            s = grpc::Status(grpc::StatusCode::ABORTED, "the coordinator says stop");
          }
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        ++r.calls;
        if (s.ok()) {
          r.latencies_us.push_back(us);
        } else {
          if (r.errors++ == 0) r.first_error = s.error_message();
        }
      }
    });
  }
  // Let every thread connect, then measure.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = Clock::now();
  go.store(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  stop.store(true);
  for (auto& th : pool) th.join();
  PhaseResult total;
  total.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& r : per_thread) {
    total.calls += r.calls;
    total.errors += r.errors;
    if (total.first_error.empty()) total.first_error = r.first_error;
    total.latencies_us.insert(total.latencies_us.end(), r.latencies_us.begin(),
                              r.latencies_us.end());
  }
  std::sort(total.latencies_us.begin(), total.latencies_us.end());
  return total;
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(q * (sorted.size() - 1) + 0.5));
  return sorted[i];
}

// Registers `n` simulated workers, all served by `worker_address`.
void RegisterSimulatedWorkers(v1::CoordinatorService::Stub& coordinator,
                              const std::string& target, const std::string& worker_address,
                              int n, Cluster& cluster) {
  cluster.last_heartbeat.reset(new std::atomic<int64_t>[n]);
  cluster.next_step.reset(new int64_t[n]);
  cluster.rank_mu.reset(new std::mutex[n]);
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::RegisterWorkerRequest request;
    request.set_address(worker_address);
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

// One row per (client threads, kind of call), as a Markdown table.
void MeasureAndPrint(const Options& options, const std::string& target, Cluster& cluster) {
  const int n = options.workers;
  std::printf("| RPC | client threads | calls/s | p50 us | p99 us | calls | errors |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (int threads : options.threads) {
    for (Kind kind : {Kind::kHeartbeat, Kind::kReportStep, Kind::kMixed}) {
      const char* name = kind == Kind::kHeartbeat    ? "Heartbeat"
                         : kind == Kind::kReportStep ? "ReportStep"
                                                     : "mixed (alternating)";
      std::fprintf(stderr, "%s, %d threads, %.1f s...\n", name, threads, options.seconds);
      PhaseResult r = RunPhase(target, cluster, kind, threads, options.seconds);
      std::printf("| %s | %d | %.0f | %.0f | %.0f | %lld | %lld |\n", name, threads,
                  (r.calls - r.errors) / r.seconds, Percentile(r.latencies_us, 0.5),
                  Percentile(r.latencies_us, 0.99), static_cast<long long>(r.calls),
                  static_cast<long long>(r.errors));
      std::fflush(stdout);
      if (r.errors > 0) std::fprintf(stderr, "  first error: %s\n", r.first_error.c_str());
    }
  }
  std::printf("\n%d simulated workers (one job: %d stages x %d replicas), %.1f s per row; "
              "latency = one call as the client sees it.\n",
              n, options.stages, n / options.stages, options.seconds);
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
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext end_ctx;
    Prepare(&end_ctx);
    cluster.As(i, &end_ctx);
    v1::StageEnd end;
    end.set_worker_id(cluster.worker_ids[i]);
    end.set_job_id(cluster.job_id);
    end.set_rank(i);
    end.set_ok(false);
    end.set_error("coordinator_capacity finished");
    v1::ReportResponse response;
    (void)coordinator.ReportStageEnd(&end_ctx, end, &response);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseArgs(argc, argv);
  std::unique_ptr<OwnCoordinator> own;
  std::string target = options.coordinator;
  if (!options.start_coordinator.empty()) {
    own = std::make_unique<OwnCoordinator>(options.start_coordinator);
    target = own->address();
  }
  const int n = options.workers;

  // 1. The simulated workers' service, and N registrations.
  FakeWorkerService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) Die("cannot serve the simulated workers' WorkerService");
  const std::string worker_address = "127.0.0.1:" + std::to_string(port);

  auto coordinator = v1::CoordinatorService::NewStub(OwnChannel(target));
  auto jobs = v1::JobService::NewStub(OwnChannel(target));
  Cluster cluster;
  cluster.stages = options.stages;
  RegisterSimulatedWorkers(*coordinator, target, worker_address, n, cluster);

  // Keeps every simulated worker alive: a heartbeat once per interval for each worker that
  // no measured call covered in the last interval.
  std::atomic<bool> stopping{false};
  std::mutex job_mu;  // guards cluster.job_id while the keepalive thread runs
  std::thread keepalive([&] {
    auto stub = v1::CoordinatorService::NewStub(OwnChannel(target));
    const int64_t interval_ns = cluster.heartbeat_ms * 1000000;
    while (!stopping.load()) {
      std::string job_id;
      {
        std::lock_guard<std::mutex> lock(job_mu);
        job_id = cluster.job_id;
      }
      for (int i = 0; i < n && !stopping.load(); ++i) {
        if (NowNs() - cluster.last_heartbeat[i].load() < interval_ns) continue;
        grpc::ClientContext ctx;
        Prepare(&ctx);
        cluster.As(i, &ctx);
        v1::HeartbeatRequest request;
        request.set_worker_id(cluster.worker_ids[i]);
        request.set_job_id(job_id);
        request.set_rank(job_id.empty() ? -1 : i);
        v1::HeartbeatResponse response;
        (void)stub->Heartbeat(&ctx, request, &response);
        cluster.last_heartbeat[i].store(NowNs());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(5, cluster.heartbeat_ms / 10)));
    }
  });

  // 2. One job over all N simulated workers.
  {
    const std::string job_id = SubmitJobOverAll(*jobs, service, options.stages, n);
    std::lock_guard<std::mutex> lock(job_mu);
    cluster.job_id = job_id;
  }
  std::fprintf(stderr,
               "coordinator %s: %d simulated workers registered, job %s (%d stages x %d "
               "replicas) running on them\n",
               target.c_str(), n, cluster.job_id.c_str(), options.stages, n / options.stages);

  // 3. The measurements.
  MeasureAndPrint(options, target, cluster);

  // 4. Cancel the job and end every rank, so the simulated workers are idle again.
  EndEveryRank(*jobs, *coordinator, cluster, n);
  stopping.store(true);
  keepalive.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
