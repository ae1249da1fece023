#include "tests/daemons/local_cluster.h"

#include "client/daemon_process.h"
#include "runtime/base/host_port.h"
#include "runtime/base/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

extern char** environ;

namespace pipetrain::test {
namespace {

// Started with client/daemon_process.h: a daemon is SIGKILLed if the test process dies
// first (e.g. killed by a test timeout), so that none outlives its test.
pid_t Spawn(const std::vector<std::string>& args, const fs::path& log) {
  const pid_t pid = client::SpawnDaemon(args, log.string(), SIGKILL);
  EXPECT_GT(pid, 0) << "cannot start " << args[0];
  return pid;
}

// Sends `sig` and reaps (SIGKILL after a minute); the exit code, or -1 if it ended by a
// signal (or was not running).
int SignalAndReap(pid_t& pid, int sig) {
  const int code = subprocess::Stop(pid, sig, absl::Seconds(60));
  pid = -1;
  return code;
}

std::string Quote(const std::string& arg) {
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << line;
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

void DaemonTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  }
  dir_ = fs::temp_directory_path() / ("pipetrain_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir_);
  fs::create_directories(dir_);
}

void DaemonTest::TearDown() {
  if (!HasFailure()) fs::remove_all(dir_);
}

fs::path DaemonTest::Write(const std::string& name, const std::string& text) {
  std::ofstream(dir_ / name) << text;
  return dir_ / name;
}

std::string StateOf(const nlohmann::json& job) {
  return job.is_object() ? job.value("state", "") : "";
}

int64_t Int64Of(const nlohmann::json& object, const std::string& key, int64_t fallback) {
  if (!object.is_object() || !object.contains(key)) return fallback;
  const nlohmann::json& v = object.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) return std::stoll(v.get<std::string>());
  return fallback;
}

const char* LocalCluster::cli_path() { return PIPETRAIN_CLI; }
const char* LocalCluster::coordinator_path() { return PIPETRAIN_COORDINATOR; }
const char* LocalCluster::worker_path() { return PIPETRAIN_WORKER; }

LocalCluster::LocalCluster(const fs::path& dir, int workers)
    : LocalCluster(dir, [workers] {
        ClusterOptions o;
        o.workers = workers;
        return o;
      }()) {}

LocalCluster::LocalCluster(const fs::path& dir, ClusterOptions options)
    : dir_(dir), options_(std::move(options)) {
  if (!StartCoordinator()) return;
  for (int w = 0; w < options_.workers; ++w) StartWorker();
}

LocalCluster::~LocalCluster() {
  for (pid_t& pid : worker_pids_) SignalAndReap(pid, SIGKILL);
  SignalAndReap(coordinator_pid_, SIGKILL);
}

fs::path LocalCluster::coordinator_log() const {
  const int start = std::max(0, coordinator_starts_ - 1);
  return dir_ / (start == 0 ? std::string("coordinator.log")
                            : "coordinator." + std::to_string(start) + ".log");
}

bool LocalCluster::StartCoordinator(int port, const std::vector<std::string>& extra_args) {
  if (coordinator_pid_ > 0) {
    ADD_FAILURE() << "the coordinator is already running";
    return false;
  }
  ++coordinator_starts_;
  const fs::path log = coordinator_log();
  std::vector<std::string> args = {
      coordinator_path(),          "--listen",       "127.0.0.1:" + std::to_string(port),  "--db",
      (dir_ / "jobs.db").string(), "--heartbeat-ms", std::to_string(options_.heartbeat_ms)};
  args.insert(args.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const fs::path port_file = dir_ / "coordinator.port";
  std::error_code ec;
  fs::remove(port_file, ec);
  args.insert(args.end(), {"--port-file", port_file.string()});
  coordinator_pid_ = Spawn(args, log);
  if (coordinator_pid_ <= 0) return false;
  absl::StatusOr<std::string> address = client::WaitForPortFile(
      port_file.string(), coordinator_pid_, absl::Seconds(20), log.string());
  if (!address.ok()) {
    if (subprocess::Exited(coordinator_pid_)) coordinator_pid_ = -1;
    ADD_FAILURE() << "the coordinator did not serve: " << address.status().message();
    return false;
  }
  address_ = *address;
  port_ = ParseHostPort(address_).value().port;
  return true;
}

void LocalCluster::KillCoordinator() { SignalAndReap(coordinator_pid_, SIGKILL); }

int LocalCluster::StopCoordinator() { return SignalAndReap(coordinator_pid_, SIGTERM); }

bool LocalCluster::RestartCoordinator() {
  KillCoordinator();
  return StartCoordinator(port_);
}

fs::path LocalCluster::worker_log(int index) const {
  return dir_ / ("worker" + std::to_string(index) + ".log");
}

int LocalCluster::StartWorker(const std::vector<std::string>& extra_args) {
  const int index = static_cast<int>(worker_pids_.size());
  std::vector<std::string> args = {worker_path(), "--coordinator", address_};
  args.insert(args.end(), options_.worker_args.begin(), options_.worker_args.end());
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  // Files anywhere (as the user running the tests can read them), unless a test says where.
  if (options_.workers_read_anywhere &&
      std::find(args.begin(), args.end(), "--data-root") == args.end()) {
    args.insert(args.end(), {"--data-root", "/"});
  }
  if (std::find(args.begin(), args.end(), "--port-file") == args.end()) {
    const fs::path port_file = dir_ / ("worker" + std::to_string(index) + ".port");
    std::error_code ec;
    fs::remove(port_file, ec);
    args.insert(args.end(), {"--port-file", port_file.string()});
  }
  worker_pids_.push_back(Spawn(args, worker_log(index)));
  return index;
}

std::string LocalCluster::CoordinatorMetricsAddress() const {
  return client::MetricsAddress((dir_ / "coordinator.port").string());
}

std::string LocalCluster::WorkerMetricsAddress(int index, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string port_file = (dir_ / ("worker" + std::to_string(index) + ".port")).string();
  while (true) {
    const std::string address = client::MetricsAddress(port_file);
    if (!address.empty() || std::chrono::steady_clock::now() >= deadline) return address;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void LocalCluster::KillWorker(int index) { SignalAndReap(worker_pids_.at(index), SIGKILL); }

int LocalCluster::StopWorker(int index) { return SignalAndReap(worker_pids_.at(index), SIGTERM); }

Result LocalCluster::Cli(const std::string& args) {
  std::string command = std::string(cli_path()) + " " + args + " --coordinator " + address_;
  for (const std::string& a : options_.cli_args) command += " " + Quote(a);
  return Shell(command);
}

Result LocalCluster::Shell(const std::string& command) {
  const fs::path out = dir_ / "cli.out", err = dir_ / "cli.err";
  const int status =
      std::system((command + " >" + out.string() + " 2>" + err.string() + " </dev/null").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out), ReadFile(err)};
}

std::vector<Result> LocalCluster::CliAll(const std::vector<std::string>& args, int parallel) {
  std::vector<std::string> commands;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string command = std::string(cli_path()) + " " + args[i] + " --coordinator " + address_;
    for (const std::string& a : options_.cli_args) command += " " + Quote(a);
    const fs::path out = dir_ / ("cli." + std::to_string(i) + ".out");
    const fs::path err = dir_ / ("cli." + std::to_string(i) + ".err");
    commands.push_back(command + " >" + out.string() + " 2>" + err.string() + " </dev/null");
  }
  std::vector<Result> results(args.size());
  std::vector<std::pair<size_t, pid_t>> running;
  auto reap_first = [&] {
    auto [i, pid] = running.front();
    running.erase(running.begin());
    int status = 0;
    results[i].exit_code =
        pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    results[i].out = ReadFile(dir_ / ("cli." + std::to_string(i) + ".out"));
    results[i].err = ReadFile(dir_ / ("cli." + std::to_string(i) + ".err"));
  };
  const pid_t parent = getpid();
  for (size_t i = 0; i < commands.size(); ++i) {
    if (static_cast<int>(running.size()) >= std::max(1, parallel)) reap_first();
    const char* command = commands[i].c_str();
    const pid_t pid = fork();
    if (pid == 0) {
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
      execl("/bin/sh", "sh", "-c", command, static_cast<char*>(nullptr));
      _exit(127);
    }
    EXPECT_GT(pid, 0) << "cannot start " << commands[i];
    running.push_back({i, pid});
  }
  while (!running.empty()) reap_first();
  return results;
}

std::vector<nlohmann::json> LocalCluster::Workers() {
  Result r = Cli("workers -o json");
  if (r.exit_code != 0) return {};
  return JsonLines(r.out);
}

nlohmann::json LocalCluster::JobStatus(const std::string& id) {
  Result r = Cli("status " + id + " -o json");
  if (r.exit_code != 0) return nullptr;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

bool LocalCluster::WaitForIdleWorkers(int n, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int idle = 0;
    for (const auto& w : Workers()) idle += w.value("state", "") == "WORKER_STATE_IDLE";
    if (idle >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

nlohmann::json LocalCluster::WaitForJob(const std::string& id,
                                        const std::function<bool(const nlohmann::json&)>& done,
                                        std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    nlohmann::json job = JobStatus(id);
    if (!job.is_null() && done(job)) return job;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return nullptr;
}

std::unique_ptr<v1::JobService::Stub> LocalCluster::JobStub() const {
  return v1::JobService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
}

v1::Job GetJob(v1::JobService::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  return stub.GetJob(&ctx, request, &job).ok() ? job : v1::Job();
}

}  // namespace pipetrain::test
