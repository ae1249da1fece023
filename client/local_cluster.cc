#include "client/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/daemon_process.h"
#include "client/jobs.h"
#include "client/spec_yaml.h"
#include "runtime/base/exit_codes.h"

namespace pipetrain::client {

namespace fs = std::filesystem;

void Exec(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "pipetrain: cannot start %s: %s\n", args[0], std::strerror(errno));
}

std::string FindDaemon(const std::string& name) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate :
         {dir / name, dir / ".." / "coordinator" / name, dir / ".." / "worker" / name}) {
      if (access(candidate.c_str(), X_OK) == 0) return fs::weakly_canonical(candidate).string();
    }
  }
  if (const char* path = std::getenv("PATH")) {
    for (absl::string_view d : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      const fs::path candidate = fs::path(std::string(d)) / name;
      if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  return "";
}

int RunOnLocalCluster(const LocalClusterRun& run) {
  absl::StatusOr<v1::JobSpec> spec = JobSpecFromYaml(run.spec_yaml);
  if (!spec.ok()) {
    std::fprintf(stderr, "pipetrain: %s\n", std::string(spec.status().message()).c_str());
    return exit_code::For(spec.status());
  }
  const std::string coordinator_bin = FindDaemon("pipetrain-coordinator");
  const std::string worker_bin = FindDaemon("pipetrain-worker");
  if (coordinator_bin.empty() || worker_bin.empty()) {
    std::fprintf(stderr,
                 "pipetrain: cannot find %s beside %s or on PATH (build it, or run without "
                 "daemons with --launch threads)\n",
                 coordinator_bin.empty() ? "pipetrain-coordinator" : "pipetrain-worker",
                 "the pipetrain binary");
    return exit_code::kUnavailable;
  }
  char dir_template[] = "/tmp/pipetrain-run-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("pipetrain: mkdtemp");
    return exit_code::kUnavailable;
  }
  const fs::path dir = dir_template;
  pid_t coordinator = -1;
  std::vector<pid_t> workers;
  auto stop_all = [&] {
    for (pid_t w : workers) kill(w, SIGTERM);  // they drain in parallel
    for (pid_t w : workers) StopDaemon(w, SIGTERM, absl::Seconds(10));
    StopDaemon(coordinator, SIGTERM, absl::Seconds(10));
  };
  auto fail = [&](int code, const std::string& message) {
    std::fprintf(stderr, "pipetrain: %s\n", message.c_str());
    stop_all();
    std::fprintf(stderr, "pipetrain: the daemons' logs are in %s\n", dir.c_str());
    return code;
  };

  const fs::path coordinator_log = dir / "coordinator.log";
  const fs::path port_file = dir / "coordinator.port";
  coordinator = SpawnDaemon({coordinator_bin, "--listen", "127.0.0.1:0", "--db",
                             (dir / "jobs.db").string(), "--port-file", port_file.string()},
                            coordinator_log.string(), SIGTERM);
  absl::StatusOr<std::string> served = WaitForPortFile(port_file.string(), coordinator,
                                                       absl::Seconds(20),
                                                       coordinator_log.string());
  if (!served.ok()) {
    if (DaemonExited(coordinator)) coordinator = -1;
    return fail(exit_code::kUnavailable,
                absl::StrCat("the coordinator did not start: ", served.status().message()));
  }
  const std::string address = *served;

  // Submitted before any worker is there: the coordinator resolves the job's ranks.
  v1::Job job;
  if (int code = SubmitJob(address, *spec, &job); code != 0) {
    stop_all();
    std::error_code ec;
    fs::remove_all(dir, ec);
    return code;
  }
  const int ranks = job.stages() * job.replicas();
  const int n = run.workers > 0 ? run.workers : ranks;
  if (n < ranks) {
    return fail(exit_code::kUsage,
                absl::StrCat("--workers ", n, " cannot run ", job.id(), ": it has ", ranks,
                             " ranks (", job.stages(), " stages x ", job.replicas(),
                             " replicas), one per worker"));
  }
  std::fprintf(stderr, "pipetrain: %s: %d stages x %d replicas on a local cluster of %d worker%s "
               "(coordinator %s, logs in %s)\n",
               job.id().c_str(), job.stages(), job.replicas(), n, n == 1 ? "" : "s",
               address.c_str(), dir.c_str());
  for (int w = 0; w < n; ++w) {
    workers.push_back(SpawnDaemon({worker_bin, "--coordinator", address},
                                  (dir / absl::StrCat("worker", w, ".log")).string(), SIGTERM));
  }
  const int code = FollowJob(address, job.id());
  stop_all();
  if (code == 0 && !run.keep_logs) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  } else {
    std::fprintf(stderr, "pipetrain: the daemons' logs are in %s\n", dir.c_str());
  }
  return code;
}

}  // namespace pipetrain::client
