// A control plane for real, for the daemon tests: a pipetrain-coordinator and
// pipetrain-worker processes on loopback, each with its log in the test's directory, driven
// by the pipetrain CLI (or by a gRPC stub). Any of them can be stopped (SIGTERM), killed
// (SIGKILL) or started again; the coordinator restarts on the same --db and port.
//
//   ClusterOptions options;
//   options.workers = 2;
//   LocalCluster cluster(dir, options);
//   ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
//   Result r = cluster.Cli("submit job.yaml --follow");
//   cluster.KillCoordinator();
//   ASSERT_TRUE(cluster.StartCoordinator(cluster.port()));  // same --db, same port
//
// Every process still running is killed (SIGKILL) when the cluster goes away, or when the
// test process dies (a test killed by its timeout leaves no daemon behind).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pipetrain/v1/job_service.grpc.pb.h"

namespace pipetrain::test {

namespace fs = std::filesystem;

// The whole file, or "" if it cannot be read.
std::string ReadFile(const fs::path& path);

// One command's exit code (-1: killed by a signal) and output.
struct Result {
  int exit_code = -1;
  std::string out, err;
};

// Every non-empty line of `text` parsed as JSON (what `list`, `workers` and `logs` print
// with -o json); a line that is not JSON is a test failure and is left out.
std::vector<nlohmann::json> JsonLines(const std::string& text);

struct ClusterOptions {
  int workers = 0;  // started with the cluster
  // The coordinator's --heartbeat-ms: a worker is lost after two silent intervals. A second,
  // so that a worker starved of the CPU for a second (seven daemons and a second test on two
  // cores) is not a fault the test did not make.
  int heartbeat_ms = 1000;
  // Appended to every start of the coordinator, of a worker, and to every Cli() command
  // (e.g. a token file for each of them).
  std::vector<std::string> coordinator_args;
  std::vector<std::string> worker_args;
  std::vector<std::string> cli_args;
  // Workers are started with `--data-root /` (jobs may name any file the test's user can
  // read) unless their arguments name a data root or this is false (the worker's default:
  // no file but its own checkpoints/).
  bool workers_read_anywhere = true;
};

class LocalCluster {
 public:
  // Starts the coordinator (on a free port, its database `dir`/jobs.db) and then the workers.
  // If the coordinator does not serve within 20 s, address() is empty and no worker starts.
  LocalCluster(const fs::path& dir, ClusterOptions options);
  LocalCluster(const fs::path& dir, int workers);
  ~LocalCluster();
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;

  const ClusterOptions& options() const { return options_; }
  // "127.0.0.1:PORT" of the coordinator; empty if it never served.
  const std::string& address() const { return address_; }
  int port() const { return port_; }

  // --- The coordinator.
  // Starts it on `port` (0: a free one; after a first start, pass port() to bind the same
  // one again) with the same --db as every start, plus `extra_args`; waits up to 20 s for
  // the address it writes to its --port-file. The log of start N (from 0) is
  // coordinator.log for N = 0, else coordinator.N.log. Returns whether it serves.
  bool StartCoordinator(int port = 0, const std::vector<std::string>& extra_args = {});
  // SIGKILL; returns once it is reaped (its port is free again).
  void KillCoordinator();
  // SIGTERM; returns its exit code once reaped (-1 if killed by a signal, or not running).
  int StopCoordinator();
  // Kills it and starts it again on the same port and --db.
  bool RestartCoordinator();
  bool coordinator_running() const { return coordinator_pid_ > 0; }
  pid_t coordinator_pid() const { return coordinator_pid_; }
  fs::path coordinator_log() const;  // of the latest start
  int coordinator_starts() const { return coordinator_starts_; }

  // --- Workers, numbered from 0 in start order; the log of worker N is worker<N>.log.
  // Starts one more (with options().worker_args and `extra_args`, and `--data-root /` unless
  // they give one or options().workers_read_anywhere is false); returns its number.
  int StartWorker(const std::vector<std::string>& extra_args = {});
  void KillWorker(int index);  // SIGKILL, reaped
  int StopWorker(int index);   // SIGTERM; its exit code once reaped (it drains first)
  bool worker_running(int index) const { return worker_pids_.at(index) > 0; }
  pid_t worker_pid(int index) const { return worker_pids_.at(index); }
  fs::path worker_log(int index) const;
  // host:port of the /metrics endpoint of the coordinator / of worker `index` (from their
  // port files; a worker's is there once it registered: waits up to `timeout`); "" if none.
  std::string CoordinatorMetricsAddress() const;
  std::string WorkerMetricsAddress(
      int index, std::chrono::milliseconds timeout = std::chrono::seconds(20)) const;
  int workers_started() const { return static_cast<int>(worker_pids_.size()); }

  // --- Asking the coordinator.
  // `pipetrain ARGS --coordinator ADDRESS` plus options().cli_args.
  Result Cli(const std::string& args);
  // Any shell command, its output captured.
  Result Shell(const std::string& command);
  // Cli() for each of `args`, up to `parallel` at a time (a CLI process takes most of a
  // second to start); the results in the order of `args`.
  std::vector<Result> CliAll(const std::vector<std::string>& args, int parallel = 4);
  // `workers -o json`, one object per worker (empty if the call failed).
  std::vector<nlohmann::json> Workers();
  // `status ID -o json` (null if the call failed).
  nlohmann::json JobStatus(const std::string& id);
  // Waits until `n` workers are idle (as `pipetrain workers` says).
  bool WaitForIdleWorkers(int n, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  // Polls `status ID -o json` until `done(job)` holds; returns the last job seen (null if
  // the timeout passed first).
  nlohmann::json WaitForJob(const std::string& id,
                            const std::function<bool(const nlohmann::json&)>& done,
                            std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // A JobService stub on a plaintext channel to address() (no token): for what the CLI does
  // not show, such as a call's status code, or to poll faster than a CLI process starts.
  std::unique_ptr<v1::JobService::Stub> JobStub() const;

  // Paths of the binaries under test.
  static const char* cli_path();
  static const char* coordinator_path();
  static const char* worker_path();

 private:
  fs::path dir_;
  ClusterOptions options_;
  std::string address_;
  int port_ = 0;
  pid_t coordinator_pid_ = -1;
  int coordinator_starts_ = 0;
  std::vector<pid_t> worker_pids_;
};

// A fixture with a fresh directory per test (under the system's temporary directory, named
// after the test), removed after a test that passed and kept for one that failed (the
// daemons' logs are there).
class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Writes `text` to `name` in the directory; returns its path.
  fs::path Write(const std::string& name, const std::string& text);
  fs::path dir_;
};

// GetJob over gRPC (what `pipetrain status` calls), 5 s deadline; an empty job if the call
// failed. Faster to poll than a CLI process.
v1::Job GetJob(v1::JobService::Stub& stub, const std::string& id);

// The JobState name of a job printed with -o json ("JOB_STATE_RUNNING", ...); "" if none.
std::string StateOf(const nlohmann::json& job);
// int64 fields are strings in proto3 JSON; this reads either form (`fallback` if absent).
int64_t Int64Of(const nlohmann::json& object, const std::string& key, int64_t fallback = 0);

}  // namespace pipetrain::test
