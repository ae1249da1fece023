#include "client/local_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cluster_calls.h"
#include "client/daemon_process.h"
#include "jobspec/run_summary.h"
#include "jobspec/spec_text.h"
#include "proto/states.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/subprocess.h"
#include "runtime/job/job_spec.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::client {

namespace fs = std::filesystem;

std::string FindDaemon(const std::string& name) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate : {dir / name, dir / ".." / "coordinator" / name,
                                      dir / ".." / "worker" / name, dir / ".." / "run" / name}) {
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

absl::StatusOr<std::string> MeasureModelProfile(const v1::JobSpec& spec, bool quiet) {
  const std::string runner = FindDaemon("pipetrain-run");
  if (runner.empty()) {
    return absl::UnavailableError(
        "cannot find pipetrain-run beside the pipetrain binary or on PATH");
  }
  std::vector<std::string> argv = {runner, "--profile", "--spec-text",
                                   jobspec::JobSpecToText(spec)};
  if (quiet) argv.push_back("--quiet");
  absl::StatusOr<subprocess::Captured> profiled = subprocess::RunCapturingStdout(argv);
  if (!profiled.ok()) return profiled.status();
  if (profiled->exit_code != 0) {
    return absl::FailedPreconditionError(
        "profiling the model for stages: auto failed (its error is above)");
  }
  return std::move(profiled->stdout_text);
}

namespace {

// Runs `argv` to its end; its exit code (kJobFailed if it was killed, kUnavailable if it
// could not start).
int RunChild(const std::vector<std::string>& argv) {
  subprocess::Options options;
  options.stdin_null = false;
  absl::StatusOr<pid_t> pid = subprocess::Start(argv, options);
  if (!pid.ok()) return exit_code::kUnavailable;
  const int code = subprocess::ExitCode(subprocess::Wait(*pid));
  if (code == 127) return exit_code::kUnavailable;  // execve failed
  return code < 0 ? exit_code::kJobFailed : code;
}

// The summary of a job run on the local cluster (jobspec/run_summary.h: the schema every
// launch mode writes), from the coordinator's last view of it and the steps it committed.
absl::Status WriteSummary(const std::string& path, const std::string& address, const v1::Job& job,
                          double wall_s) {
  absl::StatusOr<job::JobSpec> config = job::Validated(job.spec());
  if (!config.ok()) return config.status();
  absl::StatusOr<std::vector<v1::CommittedStep>> steps = CommittedSteps(address, job.id());
  if (!steps.ok()) {
    return absl::Status(
        steps.status().code(),
        absl::StrCat("reading the steps ", job.id(), " committed: ", steps.status().message()));
  }
  jobspec::RunSummary s;
  s.launch = "cluster";
  s.job_id = job.id();
  s.state = StateName(job.state());
  s.schedule = std::string(schedule::ScheduleKindName(job::ScheduleOf(*config)));
  s.stages = job.stages();
  s.replicas = job.replicas();
  s.microbatches = config->microbatches();
  s.microbatch_size = config->microbatch_size();
  s.steps = job.steps();
  s.first_step = steps->empty() ? 0 : steps->front().step();
  for (const v1::CommittedStep& step : *steps) {
    if (!step.has_loss()) continue;
    s.losses.push_back(step.loss());
    s.learning_rates.push_back(step.learning_rate());
    if (step.has_grad_norm()) s.grad_norms.push_back(step.grad_norm());
    if (step.has_eval()) {
      s.evals.push_back({step.step() + 1, step.eval_loss(), step.eval_accuracy()});
    }
  }
  s.skipped_steps = job.skipped_steps();
  s.step_time_s = job.step_time_s();
  // The coordinator's rate is of the job's unit: tokens of token data, else samples.
  const bool tokens = job.data_unit() == "tok";
  s.samples_per_s = tokens ? job.tokens_per_s() / config->data().seq_len() : job.tokens_per_s();
  if (tokens) s.tokens_per_s = job.tokens_per_s();
  s.wall_s = wall_s;
  for (const v1::StageStatus& st : job.stage_status()) {
    if (st.replica() != 0) continue;
    s.partition.emplace_back(st.layers_begin(), st.layers_end());
    jobspec::StageSummary stage;
    stage.stage = st.stage();
    stage.layers = std::make_pair(st.layers_begin(), st.layers_end());
    stage.worker = st.worker_id();
    stage.compute_s = st.compute_s();
    stage.wait_s = st.wait_s();
    stage.parameter_bytes = st.parameter_bytes();
    stage.peak_memory_bytes = st.peak_memory_bytes();
    stage.peak_tensor_bytes = st.peak_tensor_bytes();
    s.per_stage.push_back(std::move(stage));
  }
  if (job.has_plan()) s.plan_json = jobspec::PlannedLayoutJson(job.plan());
  s.config_json = job::JobToJson(*config);
  return WriteFileAtomically(path, jobspec::RunSummaryJson(s));
}

}  // namespace

int RunOnLocalCluster(const LocalClusterRun& run) {
  const auto start = std::chrono::steady_clock::now();
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
  v1::JobSpec spec = run.spec;
  if (!run.weights_file.empty() && !spec.has_weights_dir()) {
    spec.set_weights_dir((dir / "weights").string());
  }
  pid_t coordinator = -1;
  std::vector<pid_t> workers;
  auto stop_all = [&] {
    for (pid_t w : workers) kill(w, SIGTERM);  // they drain in parallel
    for (pid_t w : workers) subprocess::Stop(w, SIGTERM, absl::Seconds(10));
    subprocess::Stop(coordinator, SIGTERM, absl::Seconds(10));
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
  absl::StatusOr<std::string> served =
      WaitForPortFile(port_file.string(), coordinator, absl::Seconds(20), coordinator_log.string());
  if (!served.ok()) {
    if (subprocess::Exited(coordinator)) coordinator = -1;
    return fail(exit_code::kUnavailable,
                absl::StrCat("the coordinator did not start: ", served.status().message()));
  }
  const std::string address = *served;

  // The workers run on the job's device: a device: cuda job gets workers on the GPUs, one
  // each, round-robin.
  const std::string device = spec.has_device() ? spec.device() : "cpu";
  const auto spawn_workers = [&](int n) {
    for (int w = static_cast<int>(workers.size()); w < n; ++w) {
      // The user's own files, as with --launch threads: the workers run as the user.
      std::vector<std::string> args = {worker_bin, "--coordinator", address, "--data-root", "/"};
      if (device != "cpu") {
        args.insert(args.end(), {"--device", device == "cuda" ? absl::StrCat("cuda:", w) : device});
      }
      workers.push_back(
          SpawnDaemon(args, (dir / absl::StrCat("worker", w, ".log")).string(), SIGTERM));
    }
  };
  // A job with `stages: auto` is planned by the coordinator for the workers it has: they
  // are started first (--workers, default one per core), and the model is profiled here.
  std::string profile;
  if (spec.auto_stages()) {
    const int n = run.workers > 0 ? run.workers
                                  : std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    spawn_workers(n);
    absl::StatusOr<std::string> measured = MeasureModelProfile(spec, run.quiet);
    if (!measured.ok()) {
      return fail(exit_code::For(measured.status()), std::string(measured.status().message()));
    }
    profile = *std::move(measured);
    if (int code = WaitForWorkers(address, n, absl::Seconds(30)); code != 0) {
      return fail(code, "the workers did not register");
    }
  }
  // Otherwise submitted before any worker is there: the coordinator resolves the job's ranks.
  v1::Job job;
  if (int code = SubmitJob(address, spec, &job, profile); code != 0) {
    stop_all();
    std::error_code ec;
    fs::remove_all(dir, ec);
    return code;
  }
  const int ranks = job.stages() * job.replicas();
  const int n = run.workers > 0 ? run.workers : std::max<int>(ranks, workers.size());
  if (n < ranks) {
    return fail(
        exit_code::kUsage,
        absl::StrCat("--workers ", n, " cannot run ", job.id(), ": it has ", ranks, " ranks (",
                     job.stages(), " stages x ", job.replicas(), " replicas), one per worker"));
  }
  if (!run.quiet) {
    std::fprintf(stderr,
                 "pipetrain: %s: %d stages x %d replicas on a local cluster of %d worker%s "
                 "(coordinator %s, logs in %s)\n",
                 job.id().c_str(), job.stages(), job.replicas(), n, n == 1 ? "" : "s",
                 address.c_str(), dir.c_str());
  }
  spawn_workers(n);
  if (job.has_plan() && !run.quiet) {
    std::fprintf(stderr, "pipetrain: %s planned by %s: %s; predicted step %.2f ms\n",
                 job.id().c_str(), job.plan().planner().c_str(), job.plan().layout().c_str(),
                 job.plan().predicted_step_time_s() * 1e3);
  }
  v1::Job final_job;
  int code = FollowJob(address, job.id(), run.quiet, &final_job);
  if (code == exit_code::kOk && !run.summary_file.empty()) {  // the coordinator still serves
    const double wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (absl::Status s = WriteSummary(run.summary_file, address, final_job, wall_s); !s.ok()) {
      std::fprintf(stderr, "pipetrain: %s\n", std::string(s.message()).c_str());
      code = exit_code::kJobFailed;
    }
  }
  stop_all();
  if (code == exit_code::kOk && !run.weights_file.empty()) {
    // The stage files are LibTorch's: pipetrain-run gathers them.
    const std::string runner = FindDaemon("pipetrain-run");
    code = runner.empty()
               ? exit_code::kUnavailable
               : RunChild({runner, "--spec-text", jobspec::JobSpecToText(spec), "--gather-weights",
                           spec.weights_dir(), "--save-weights", run.weights_file});
    if (code != exit_code::kOk) {
      std::fprintf(stderr, "pipetrain: gathering the weights from %s into %s failed\n",
                   spec.weights_dir().c_str(), run.weights_file.c_str());
    }
  }
  if (code == 0 && !run.keep_logs) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  } else {
    std::fprintf(stderr, "pipetrain: the daemons' logs are in %s\n", dir.c_str());
  }
  return code;
}

}  // namespace pipetrain::client
