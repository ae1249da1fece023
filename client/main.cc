// pipetrain: the command-line interface.
//
//   pipetrain run [JOB.yaml] [flags]   train on this machine: a local cluster (a coordinator
//                                      and one worker process per rank), or with
//                                      --launch threads|processes, pipetrain-run (no daemons)
//   pipetrain submit|status|list|logs|cancel|flush|switch|checkpoint|stop|workers|health
//
// The CLI speaks to daemons only (proto/); the training runtime is in pipetrain-run and the
// daemons, which it finds beside itself (see local_cluster.h), so it starts in milliseconds.
// Exit codes (runtime/base/exit_codes.h, shared with pipetrain-run): 0 ok, 1 the job failed,
// 2 bad usage or invalid job, 3 not found, 4 unauthenticated or denied, 5 unavailable,
// 130 interrupted.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/jobs.h"
#include "client/local_cluster.h"
#include "runtime/base/exit_codes.h"

namespace pipetrain::client {
namespace {

constexpr char kRunHelp[] = R"(pipetrain run [JOB.yaml] [flags]

Trains a job on this machine. By default on a local cluster: a pipetrain-coordinator and one
pipetrain-worker per pipeline stage and replica, each a process of its own on loopback; the
job is submitted and followed, and the daemons are stopped at the end (their logs are kept
only if the job fails). With --launch threads or processes it runs without daemons
(pipetrain-run).

Options of the local cluster:
  --launch cluster|threads|processes   where the stages run (default: cluster)
  --workers N                          workers to start (default: one per rank)
  --keep-logs                          keep the daemons' logs when the job succeeds
  --summary, --trace, --reference and --save-weights are taken with threads or processes.

The job: a YAML file and the flags below, which override it.
)";

// Runs `argv` and returns its exit code (stdout captured into `out` if given).
int RunChild(const std::vector<std::string>& argv, std::string* out) {
  int pipe_fds[2] = {-1, -1};
  if (out && pipe(pipe_fds) != 0) return exit_code::kUnavailable;
  const pid_t pid = fork();
  if (pid == 0) {
    if (out) {
      dup2(pipe_fds[1], STDOUT_FILENO);
      close(pipe_fds[0]);
      close(pipe_fds[1]);
    }
    Exec(argv);
    _exit(exit_code::kUnavailable);
  }
  if (out) {
    close(pipe_fds[1]);
    char buffer[4096];
    for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) out->append(buffer, n);
    close(pipe_fds[0]);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : exit_code::kJobFailed;
}

int Run(const std::vector<std::string>& args) {
  std::string launch = "cluster";
  LocalClusterRun cluster;
  std::vector<std::string> rest;  // for pipetrain-run
  bool help = false;
  std::vector<std::string> without_daemons;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag) -> std::string {
      if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0) {
        return a.substr(flag.size() + 1);
      }
      if (i + 1 >= args.size()) return "";
      return args[++i];
    };
    if (a == "--launch" || a.rfind("--launch=", 0) == 0) {
      launch = value("--launch");
    } else if (a == "--workers" || a.rfind("--workers=", 0) == 0) {
      const std::string n = value("--workers");
      try {
        cluster.workers = std::stoi(n);
      } catch (const std::exception&) {
        cluster.workers = -1;
      }
      if (cluster.workers < 1) {
        std::fprintf(stderr, "error: --workers: expected a positive number, got '%s'\n", n.c_str());
        return exit_code::kUsage;
      }
    } else if (a == "--keep-logs") {
      cluster.keep_logs = true;
    } else {
      if (a == "-h" || a == "--help") help = true;
      for (const char* flag : {"--summary", "--trace", "--reference", "--save-weights"}) {
        const std::string f = flag;
        if (a == f || a.rfind(f + "=", 0) == 0) without_daemons.push_back(f);
      }
      rest.push_back(a);
    }
  }
  const std::string runner = FindDaemon("pipetrain-run");
  if (runner.empty()) {
    std::fprintf(stderr, "pipetrain: cannot find pipetrain-run beside the pipetrain binary or on "
                         "PATH\n");
    return exit_code::kUnavailable;
  }
  if (help) {
    std::fputs(kRunHelp, stdout);
    std::fflush(stdout);
    return RunChild({runner, "--help"}, nullptr);
  }
  if (launch == "threads" || launch == "processes") {
    // Replaced by pipetrain-run (same process: signals and the exit code are its own).
    std::vector<std::string> argv = {runner, "--launch", launch};
    argv.insert(argv.end(), rest.begin(), rest.end());
    Exec(argv);
    return exit_code::kUnavailable;
  }
  if (launch != "cluster") {
    std::fprintf(stderr, "error: --launch: expected cluster, threads or processes, got '%s'\n",
                 launch.c_str());
    return exit_code::kUsage;
  }
  if (!without_daemons.empty()) {
    std::string names;
    for (const std::string& n : without_daemons) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr,
                 "error: %s: only with --launch threads or processes (without daemons); on the "
                 "local cluster the job's weights_dir keeps each stage's weights\n",
                 names.c_str());
    return exit_code::kUsage;
  }
  // The job with every flag applied, validated, as the job file the coordinator takes.
  std::vector<std::string> argv = {runner, "--print-job-yaml"};
  argv.insert(argv.end(), rest.begin(), rest.end());
  if (int code = RunChild(argv, &cluster.spec_yaml); code != 0) return code;
  return RunOnLocalCluster(cluster);
}

}  // namespace
}  // namespace pipetrain::client

int main(int argc, char** argv) {
  using namespace pipetrain;
  std::signal(SIGINT, [](int) { std::_Exit(exit_code::kInterrupted); });
  if (argc >= 2 && std::string(argv[1]) == "run") {
    return client::Run(std::vector<std::string>(argv + 2, argv + argc));
  }
  CLI::App app{"pipetrain: pipeline-parallel training with exact semantics (GPipe, "
               "1F1B-Flush, PipeDream-2BW). `pipetrain run` trains on this machine; the other "
               "commands talk to a coordinator."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pipetrain 0.1.0");
  app.add_subcommand("run", "Train a job on this machine: a local cluster by default, or "
                            "without daemons (--launch threads|processes); see run --help");
  std::function<int()> job_command = client::AddJobCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  return job_command();
}
