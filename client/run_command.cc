#include "client/run_command.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "client/local_cluster.h"
#include "jobspec/plan_flags.h"
#include "jobspec/planned_layout.h"
#include "jobspec/run_outputs.h"
#include "jobspec/spec_flags.h"
#include "jobspec/spec_text.h"
#include "run/link_command.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/subprocess.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::client {
namespace {

constexpr char kRunHelp[] =
    "Train a job on this machine. By default on a local cluster: a pipetrain-coordinator and "
    "one pipetrain-worker per pipeline stage and replica, each a process of its own on "
    "loopback; the job is submitted and followed, and the daemons are stopped at the end "
    "(their logs are kept only if the job fails). With --launch threads or processes it runs "
    "without daemons (pipetrain-run). The job: a YAML file and the flags below, which "
    "override it; with neither, the built-in GPT on the built-in corpus, 4 stages, "
    "PipeDream-2BW.";

struct RunCommand {
  std::string job_file;
  std::string launch = "cluster";
  int workers = 0;
  bool keep_logs = false;
  jobspec::RunOutputs outputs;
  jobspec::PlanFlags planning;  // for `stages: auto`
  std::unique_ptr<jobspec::SpecFlags> spec_flags;
};

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "pipetrain: %s\n", std::string(status.message()).c_str());
  return code;
}

int RunJob(const RunCommand& c) {
  absl::StatusOr<v1::JobSpec> spec = jobspec::BuildJobSpec(c.job_file, *c.spec_flags);
  if (!spec.ok()) return Fail(spec.status(), exit_code::For(spec.status()));
  // Refused here with every violation, before anything starts.
  absl::StatusOr<job::JobSpec> config = job::Validated(*spec);
  if (!config.ok()) return Fail(config.status(), exit_code::kUsage);

  if (c.launch == "threads" || c.launch == "processes") {
    const std::string runner = FindDaemon("pipetrain-run");
    if (runner.empty()) {
      return Fail(absl::UnavailableError(
                      "cannot find pipetrain-run beside the pipetrain binary or on PATH"),
                  exit_code::kUnavailable);
    }
    // Replaced by pipetrain-run (same process: signals and the exit code are its own).
    std::vector<std::string> argv = {runner, "--launch", c.launch, "--spec-text",
                                     jobspec::JobSpecToText(*spec)};
    for (std::string& a : c.outputs.AsArgs()) argv.push_back(std::move(a));
    if (config->auto_stages()) {
      for (std::string& a : c.planning.AsArgs()) argv.push_back(std::move(a));
    }
    return Fail(subprocess::Exec(argv), exit_code::kUnavailable);
  }
  std::vector<std::string> without_daemons;
  if (!c.outputs.trace.empty()) without_daemons.push_back("--trace");
  if (c.outputs.reference) without_daemons.push_back("--reference");
  if (!without_daemons.empty()) {
    std::fprintf(stderr, "pipetrain: %s: only with --launch threads or processes\n",
                 absl::StrJoin(without_daemons, ", ").c_str());
    return exit_code::kUsage;
  }
  if (c.outputs.dry_run) {  // the conversion the coordinator and every worker make
    std::printf("%s\n", job::JobToJson(*config).c_str());
    return exit_code::kOk;
  }
  LocalClusterRun run;
  run.spec = *std::move(spec);
  run.workers = c.workers;
  run.keep_logs = c.keep_logs;
  run.quiet = c.outputs.quiet;
  run.summary_file = c.outputs.summary;
  run.weights_file = c.outputs.save_weights;
  return RunOnLocalCluster(run);
}

constexpr char kPlanHelp[] =
    "Plan a job: profile its model on this machine (every layer's forward, backward and "
    "optimizer time and memory at each micro-batch size the planner may pick, cached; the Gloo "
    "links), then let the job's planner (--planner 2bw | pipedream | hippie) choose the "
    "schedule, stages, replicas, micro-batch size and recomputation for N workers with the "
    "given memory each, keeping the job's global batch (replicas x microbatches x "
    "microbatch_size). Prints the layout, its predicted step time, throughput and per-stage "
    "peak memory, and the best layout of every other shape with why it lost. `stages: auto` "
    "in a job does the same when it runs.";

constexpr char kProfileHelp[] =
    "Profile a job's model on this machine and print the profile the planners use (JSON): per "
    "micro-batch size, per layer forward/backward/optimizer seconds and output, parameter, "
    "optimizer-state, stash and working bytes; the Gloo links' latency and bandwidth.";

constexpr char kLinkHelp[] =
    "Measure the links between this host and another (Gloo point to point and a 2-rank "
    "AllReduce, each a latency and a bandwidth), as the planners and the coordinator's "
    "placement take them for ranks on different hosts. Run --listen ADDRESS on one host; it "
    "prints the --connect to run on the other (with --address, that host's own) and, once "
    "both are done, the links as JSON, which `pipetrain plan --host-links FILE` reads.";

// `plan` and `profile`: handed over to pipetrain-run, which links LibTorch.
struct PlanCommand {
  std::string job_file;
  jobspec::PlanFlags planning;
  std::unique_ptr<jobspec::SpecFlags> spec_flags;
  bool quiet = false;
};

int PlanJob(const PlanCommand& c) {
  absl::StatusOr<v1::JobSpec> spec = jobspec::BuildJobSpec(c.job_file, *c.spec_flags);
  if (!spec.ok()) return Fail(spec.status(), exit_code::For(spec.status()));
  // Planning replaces the job's layout, so it is not checked (--predict keeps it).
  if (!c.planning.predict) jobspec::MarkForPlanning(&*spec);
  absl::StatusOr<job::JobSpec> config = job::Validated(*spec);
  if (!config.ok()) return Fail(config.status(), exit_code::kUsage);
  const std::string runner = FindDaemon("pipetrain-run");
  if (runner.empty()) {
    return Fail(
        absl::UnavailableError("cannot find pipetrain-run beside the pipetrain binary or on PATH"),
        exit_code::kUnavailable);
  }
  std::vector<std::string> argv = {runner, "--spec-text", jobspec::JobSpecToText(*spec)};
  for (std::string& a : c.planning.AsArgs()) argv.push_back(std::move(a));
  if (c.quiet) argv.push_back("--quiet");
  return Fail(subprocess::Exec(argv), exit_code::kUnavailable);
}

}  // namespace

std::function<int()> AddPlanCommands(CLI::App& app) {
  auto chosen = std::make_shared<std::function<int()>>();
  for (const bool profile : {false, true}) {
    auto c = std::make_shared<PlanCommand>();
    CLI::App* cmd =
        app.add_subcommand(profile ? "profile" : "plan", profile ? kProfileHelp : kPlanHelp);
    cmd->add_option("job", c->job_file, "YAML job file (flags given too override it)")
        ->check(CLI::ExistingFile);
    c->planning.AddTo(cmd, jobspec::PlanFlags::Where::kPlanCommand);
    cmd->add_flag("-q,--quiet", c->quiet, "no progress lines on stderr");
    c->spec_flags = std::make_unique<jobspec::SpecFlags>(cmd);
    cmd->callback([c, chosen, profile] {
      c->planning.plan = !profile;
      c->planning.profile = profile;
      *chosen = [c] { return PlanJob(*c); };
    });
  }
  return [chosen] { return *chosen ? (*chosen)() : exit_code::kUsage; };
}

std::function<int()> AddLinkCommand(CLI::App& app) {
  auto flags = std::make_shared<run::LinkFlags>();
  CLI::App* cmd = app.add_subcommand("profile-link", kLinkHelp);
  flags->AddTo(cmd);
  return [flags] {
    const std::string runner = FindDaemon("pipetrain-run");
    if (runner.empty()) {
      return Fail(absl::UnavailableError(
                      "cannot find pipetrain-run beside the pipetrain binary or on PATH"),
                  exit_code::kUnavailable);
    }
    std::vector<std::string> argv = {runner, "profile-link"};
    for (std::string& a : flags->AsArgs()) argv.push_back(std::move(a));
    return Fail(subprocess::Exec(argv), exit_code::kUnavailable);
  };
}

std::function<int()> AddRunCommand(CLI::App& app) {
  auto c = std::make_shared<RunCommand>();
  CLI::App* run = app.add_subcommand("run", kRunHelp);
  run->add_option("job", c->job_file, "YAML job file (flags given too override it)")
      ->check(CLI::ExistingFile);
  auto* launch = run->add_option_group("launch");
  launch
      ->add_option("--launch", c->launch,
                   "cluster: a local coordinator and workers; threads: every stage a thread "
                   "of one process; processes: one process per stage over Gloo (no daemons)")
      ->check(CLI::IsMember({"cluster", "threads", "processes"}))
      ->capture_default_str();
  launch->add_option("--workers", c->workers, "cluster: workers to start (default: one per rank)")
      ->check(CLI::PositiveNumber);
  launch->add_flag("--keep-logs", c->keep_logs,
                   "cluster: keep the daemons' logs when the job succeeds");
  c->outputs.AddTo(run);
  c->planning.AddTo(run, jobspec::PlanFlags::Where::kRunCommand);
  c->spec_flags = std::make_unique<jobspec::SpecFlags>(run);
  return [c] { return RunJob(*c); };
}

}  // namespace pipetrain::client
