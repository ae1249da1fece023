// pipetrain-run: runs a job on this machine without daemons, every stage of every replica a
// thread of this process (--launch threads) or a process of its own over Gloo (--launch
// processes). `pipetrain run --launch threads|processes` builds the job spec and hands it
// over (--spec-text); run directly, it takes a job file and the same flags
// (jobspec/spec_flags.h). It links no gRPC, so it also builds where only LibTorch is.
//
//   pipetrain-run [JOB.yaml] [flags]
//
// Exit codes (runtime/base/exit_codes.h, shared with the pipetrain CLI): 0 ok, 1 the job
// failed, 2 bad usage or invalid job, 3 a file it names is not found, 130 interrupted.
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "jobspec/planned_layout.h"
#include "jobspec/run_outputs.h"
#include "jobspec/run_summary.h"
#include "jobspec/spec_flags.h"
#include "jobspec/spec_text.h"
#include "run/link_command.h"
#include "run/plan_command.h"
#include "runtime/base/allocator.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/byte_size.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"
#include "runtime/base/progress_line.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/uncaught_exceptions.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/launch/stage_processes.h"
#include "runtime/job/launch/stage_run.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/job/report/report.h"
#include "runtime/job/report/trace.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/profiler/profiler.h"
#include "runtime/weights/tensor_list_file.h"

namespace pipetrain::run_main {
namespace {

// 1536 -> "1.5 KiB", 0 -> "-" (not measured).
// The progress line (runtime/base/progress_line.h) on stderr, unless quiet.
class ProgressPrinter {
 public:
  ProgressPrinter(bool quiet, bool token_data)
      : quiet_(quiet), token_data_(token_data), line_(isatty(STDERR_FILENO)) {}

  void operator()(const job::Progress& p) {
    if (quiet_) return;
    progress::Progress now;
    now.done = p.step + 1;
    now.steps = p.steps;
    now.loss = p.loss;
    now.rate = token_data_ ? p.tokens_per_s : p.samples_per_s;
    now.unit = token_data_ ? "tok" : "samples";
    now.elapsed_s = p.elapsed_s;
    std::fputs(line_.Update(now).c_str(), stderr);
    std::fflush(stderr);
  }

 private:
  bool quiet_, token_data_;
  progress::ProgressLine line_;
};

// The run's summary (jobspec/run_summary.h: the schema every launch mode writes).
jobspec::RunSummary SummaryOf(const job::JobReport& r, const job::JobSpec& config,
                              const std::string& launch,
                              const std::optional<v1::PlannedLayout>& plan) {
  jobspec::RunSummary s;
  s.launch = launch;
  s.schedule = r.schedule;
  s.stages = r.stages;
  s.replicas = r.replicas;
  s.microbatches = r.micro_batches;
  s.microbatch_size = r.micro_batch_size;
  s.steps = r.steps;
  s.model = r.model_summary;
  s.data = r.data_summary;
  for (const auto& range : r.partition) s.partition.emplace_back(range.begin, range.end);
  s.first_step = r.first_step;
  s.losses = r.losses;
  s.learning_rates = r.learning_rates;
  s.grad_norms = r.grad_norms;
  for (const job::EvalPoint& e : r.evals) s.evals.push_back({e.step, e.loss, e.accuracy});
  // Every rank skips the same steps.
  s.skipped_steps = r.stage_stats.empty() ? 0 : r.stage_stats[0].skipped_steps;
  s.data_entropy = r.data_entropy;
  s.step_time_s = r.step_time_s;
  s.ideal_step_time_s = r.ideal_step_time_s;
  if (r.replicas > 1) {
    s.allreduce_s = r.allreduce_s;
    s.exposed_allreduce_s = r.exposed_allreduce_s;
  }
  s.samples_per_s = r.samples_per_s;
  if (r.token_data) s.tokens_per_s = r.tokens_per_s;
  s.wall_s = r.wall_s;
  s.threads_per_stage = r.threads_per_stage;
  for (const job::StageReport& st : r.per_stage) {
    jobspec::StageSummary stage;
    stage.stage = st.stage;
    stage.layers = std::make_pair(st.layers.front().begin, st.layers.front().end);
    if (st.layers.size() > 1) {
      for (const model::LayerRange& range : st.layers) {
        stage.model_stage_layers.emplace_back(range.begin, range.end);
      }
    }
    stage.compute_s = st.compute_s;
    stage.wait_s = st.wait_s;
    stage.allreduce_s = st.allreduce_s;
    stage.peak_stashed_microbatches = st.peak_stashed_microbatches;
    stage.peak_weight_versions = st.peak_weight_versions;
    stage.parameter_bytes = st.parameter_bytes;
    stage.peak_memory_bytes = st.peak_memory_bytes;
    stage.peak_tensor_bytes = st.peak_tensor_bytes;
    stage.bytes_sent = st.bytes_sent;
    s.per_stage.push_back(std::move(stage));
  }
  s.max_param_rel_diff = r.max_param_rel_diff;
  if (plan) s.plan_json = jobspec::PlannedLayoutJson(*plan);
  s.config_json = job::JobToJson(config);
  return s;
}

void PrintSummary(const job::JobReport& r) {
  std::printf("\n%s | %s\n", r.model_summary.c_str(), r.data_summary.c_str());
  const int model_stages = static_cast<int>(r.partition.size());
  std::printf(
      "schedule %s, %d stages (%s)%s x %d replicas, %d micro-batches of %d, %d steps\n",
      r.schedule.c_str(), r.stages, model::FormatRanges(r.partition).c_str(),
      model_stages == r.stages ? "" : absl::StrCat(" as ", model_stages, " model stages").c_str(),
      r.replicas, r.micro_batches, r.micro_batch_size, r.steps);
  // The final loss is the last finite one: the last steps may have been skipped (NaN).
  size_t last = r.losses.size() - 1;
  while (last > 0 && !std::isfinite(r.losses[last])) --last;
  const double final_loss = r.losses[last];
  std::printf("loss %.4f -> %.4f", r.losses.front(), final_loss);
  if (last + 1 < r.losses.size()) {
    std::printf(" (the last %zu steps were skipped, their loss or gradients not finite)",
                r.losses.size() - 1 - last);
  }
  if (r.data_entropy) {
    const double gap = r.losses.front() - *r.data_entropy;
    std::printf("   (entropy %.4f: %.1f%% of the gap closed)", *r.data_entropy,
                gap > 0 ? 100.0 * (r.losses.front() - final_loss) / gap : 0.0);
  }
  if (!r.evals.empty()) {
    const job::EvalPoint& e = r.evals.back();
    std::printf("\nheld-out loss %.4f, accuracy %.4f (before step %lld; %zu evaluations)", e.loss,
                e.accuracy, static_cast<long long>(e.step), r.evals.size());
  }
  const bool tokens = r.token_data;
  std::printf("\nstep %.2f ms (ideal %.2f ms, efficiency %.3f), %s %s, wall %s\n",
              r.step_time_s * 1e3, r.ideal_step_time_s * 1e3,
              r.step_time_s > 0 ? r.ideal_step_time_s / r.step_time_s : 0.0,
              progress::FormatRate(tokens ? r.tokens_per_s : r.samples_per_s).c_str(),
              tokens ? "tok/s" : "samples/s", progress::FormatDuration(r.wall_s).c_str());
  std::printf("%-6s %-8s %-8s %-9s %-10s %-10s %-10s %-10s\n", "stage", "layers", "stashed",
              "versions", "compute_s", "wait_s", "params", "peak_mem");
  for (const auto& s : r.per_stage) {
    std::printf("%-6d %-8s %-8d %-9d %-10.3f %-10.3f %-10s %-10s\n", s.stage,
                model::FormatRanges(s.layers).c_str(), s.peak_stashed_microbatches,
                s.peak_weight_versions, s.compute_s, s.wait_s,
                ByteSizeOrDash(s.parameter_bytes).c_str(),
                ByteSizeOrDash(s.peak_memory_bytes).c_str());
  }
  if (r.max_param_rel_diff) {
    std::printf("max relative parameter difference vs. the un-pipelined reference: %.3g\n",
                *r.max_param_rel_diff);
  }
}

struct RunnerFlags {
  std::string job_file;
  std::string spec_text;  // the job spec in protobuf text format (from `pipetrain run`)
  std::string launch = "threads";
  jobspec::RunOutputs outputs;
  jobspec::PlanFlags planning;  // pipetrain plan / profile, and `stages: auto`
  std::string gather_weights;   // set by `pipetrain run`: merge DIR/stage<R>.pt into one file
  // Set by the launcher in the stage processes it starts.
  int stage_process = -1;
  std::vector<int> link_peer_ports;  // the profiler's link peer (profiler::RunLinkPeer)
  int store_port = 0;
  std::string result_dir;
};

// One line on stderr, prefixed as the CLI's own errors are (`pipetrain run` becomes this).
int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "pipetrain: %s\n", std::string(status.message()).c_str());
  return code;
}

// The job: the spec handed over as text, or the job file with the flags applied.
absl::StatusOr<v1::JobSpec> ResolveSpec(const RunnerFlags& flags,
                                        const jobspec::SpecFlags& spec_flags) {
  if (flags.spec_text.empty()) return jobspec::BuildJobSpec(flags.job_file, spec_flags);
  absl::StatusOr<v1::JobSpec> spec = jobspec::JobSpecFromText(flags.spec_text);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--spec-text: ", spec.status().message()));
  }
  return spec;
}

// The whole model's weights file: the parameters in layer order, then the buffers
// (torch::save of one tensor list).
absl::Status SaveWholeModel(std::vector<at::Tensor> parameters,
                            const std::vector<at::Tensor>& buffers, const std::string& path) {
  parameters.insert(parameters.end(), buffers.begin(), buffers.end());
  absl::StatusOr<std::string> bytes = weights::SerializeTensorList(parameters);
  if (!bytes.ok()) return bytes.status();
  return WriteFileAtomically(path, *bytes);
}

// The whole model's parameters (layer order, whichever rank held each model stage), then
// its buffers, from the stage files of replica 0 in `dir` (written by the ranks of a job
// with that weights_dir).
absl::Status GatherWeights(const job::JobSpec& config, const std::string& dir,
                           const std::string& out) {
  std::vector<job::StageOutcome> ranks;
  for (int s = 0; s < job::PipelineStages(config); ++s) {
    absl::StatusOr<job::StageOutcome> stage = job::ReadStageOutcome(dir, s);
    if (!stage.ok()) return stage.status();
    ranks.push_back(*std::move(stage));
  }
  std::vector<at::Tensor> parameters, buffers;
  PT_RETURN_IF_ERROR(job::WeightsInModelOrder(absl::MakeSpan(ranks), parameters, buffers));
  return SaveWholeModel(std::move(parameters), buffers, out);
}

// Writes what the run's outputs ask for; the first failure is returned.
absl::Status WriteOutputs(const jobspec::RunOutputs& outputs, const job::JobSpec& config,
                          const std::string& launch, const std::optional<v1::PlannedLayout>& plan,
                          const job::JobReport& report) {
  if (!outputs.summary.empty()) {
    PT_RETURN_IF_ERROR(WriteFileAtomically(
        outputs.summary, jobspec::RunSummaryJson(SummaryOf(report, config, launch, plan))));
  }
  if (!outputs.trace.empty()) {
    PT_RETURN_IF_ERROR(WriteFileAtomically(outputs.trace, job::ChromeTraceJson(report)));
  }
  if (!outputs.save_weights.empty()) {
    return SaveWholeModel(report.final_parameters, report.final_buffers, outputs.save_weights);
  }
  return absl::OkStatus();
}

// Trains `config` as the flags say, then reports and writes the outputs (with the plan's
// record when it was planned here).
int Train(const RunnerFlags& flags, const job::JobSpec& config,
          const std::optional<v1::PlannedLayout>& plan, const std::string& self) {
  const jobspec::RunOutputs& outputs = flags.outputs;
  const bool token_data = job::DataKindOf(config) != "classification";
  ProgressPrinter printer(outputs.quiet, token_data);
  absl::StatusOr<job::JobReport> report;
  if (flags.launch == "processes") {
    job::ProcessRunOptions options;
    options.command = {self, "--spec-text", jobspec::JobSpecToText(config)};
    options.on_progress = std::ref(printer);
    report = job::RunAsProcesses(config, options);
  } else {
    job::RunOptions options;
    options.on_progress = std::ref(printer);
    report = job::RunInProcess(config, options);
  }
  if (!report.ok()) return Fail(report.status(), exit_code::ForJob(report.status()));
  if (outputs.reference) {
    if (!outputs.quiet) std::fprintf(stderr, "training the un-pipelined reference...\n");
    auto reference = job::TrainReference(config);
    if (!reference.ok()) return Fail(reference.status(), exit_code::kJobFailed);
    report->max_param_rel_diff = job::MaxRelativeDifference(report->final_parameters, *reference);
  }
  if (!outputs.quiet) PrintSummary(*report);
  if (absl::Status s = WriteOutputs(outputs, config, flags.launch, plan, *report); !s.ok()) {
    return Fail(s, exit_code::kJobFailed);
  }
  return exit_code::kOk;
}

int Run(const RunnerFlags& flags, const jobspec::SpecFlags& spec_flags, const std::string& self) {
  absl::StatusOr<v1::JobSpec> spec = ResolveSpec(flags, spec_flags);
  if (!spec.ok()) return Fail(spec.status(), exit_code::For(spec.status()));
  // Planning replaces the job's layout, so it is not checked (--predict keeps it).
  if ((flags.planning.plan || flags.planning.profile) && !flags.planning.predict) {
    jobspec::MarkForPlanning(&*spec);
  }
  absl::StatusOr<job::JobSpec> config = job::Validated(*spec);
  if (!config.ok()) return Fail(config.status(), exit_code::kUsage);

  if (!flags.link_peer_ports.empty()) {
    absl::Status s = profiler::RunLinkPeer(flags.link_peer_ports[0], flags.link_peer_ports[1]);
    if (!s.ok())
      std::fprintf(stderr, "pipetrain: link peer: %s\n", std::string(s.message()).c_str());
    return s.ok() ? exit_code::kOk : exit_code::kJobFailed;
  }
  if (flags.stage_process >= 0) {
    absl::Status s =
        job::RunStageProcess(*config, {flags.stage_process, flags.store_port, flags.result_dir});
    if (!s.ok()) {
      if (!s.GetPayload(job::kReportedToLauncher)) {  // else the launcher reports it
        std::fprintf(stderr, "pipetrain: rank %d: %s\n", flags.stage_process,
                     std::string(s.message()).c_str());
      }
      return exit_code::kJobFailed;
    }
    return exit_code::kOk;
  }
  if (flags.planning.plan || flags.planning.profile || flags.planning.predict) {
    jobspec::PlanFlags planning = flags.planning;
    planning.quiet = flags.outputs.quiet;
    return run::RunPlanCommand(planning, *config);
  }
  std::optional<v1::PlannedLayout> plan;  // with `stages: auto`
  if (config->auto_stages()) {
    // Planned here, for this machine's cores (or --plan-workers), then run as planned.
    jobspec::PlanFlags planning = flags.planning;
    planning.quiet = flags.outputs.quiet;
    absl::StatusOr<run::AppliedPlan> planned = run::PlanAndApply(planning, *config);
    if (!planned.ok()) return Fail(planned.status(), exit_code::For(planned.status()));
    *config = std::move(planned->config);
    plan = std::move(planned->record);
  }
  if (flags.outputs.dry_run) {
    std::printf("%s\n", job::JobToJson(*config).c_str());
    return exit_code::kOk;
  }
  if (!flags.gather_weights.empty()) {
    absl::Status s = GatherWeights(*config, flags.gather_weights, flags.outputs.save_weights);
    return s.ok() ? exit_code::kOk : Fail(s, exit_code::kJobFailed);
  }
  return Train(flags, *config, plan, self);
}

void AddRunnerFlags(CLI::App* app, RunnerFlags& flags) {
  app->add_option("job", flags.job_file, "YAML job file (flags given too override it)")
      ->check(CLI::ExistingFile);
  app->add_option("--launch", flags.launch,
                  "threads: all stages in this process; processes: one process per stage, "
                  "connected by Gloo over loopback TCP")
      ->check(CLI::IsMember({"threads", "processes"}))
      ->capture_default_str();
  flags.outputs.AddTo(app);
  flags.planning.AddTo(app, jobspec::PlanFlags::Where::kRunner);
  auto* internal = app->add_option_group("");  // set by the pipetrain CLI or the launcher
  internal->add_option("--spec-text", flags.spec_text);
  internal->add_option("--gather-weights", flags.gather_weights);
  internal->add_option("--stage-process", flags.stage_process);
  internal->add_option("--store-port", flags.store_port);
  internal->add_option("--result-dir", flags.result_dir);
  internal->add_option("--profile-link-peer", flags.link_peer_ports)->expected(2);
}

}  // namespace
}  // namespace pipetrain::run_main

int main(int argc, char** argv) {
  using namespace pipetrain;
  ReportUncaughtExceptions("pipetrain-run");
  TuneAllocatorForTraining();
  memory::CountTensorMemory();  // the summary's peak_tensor_bytes, compared with plans
  std::signal(SIGINT, [](int) { std::_Exit(exit_code::kInterrupted); });
  if (argc > 1 && std::string(argv[1]) == "profile-link") {
    CLI::App link{"pipetrain-run profile-link: the links between this host and another"};
    run::LinkFlags flags;
    flags.AddTo(&link);
    try {
      link.parse(argc - 1, argv + 1);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return link.exit(e);  // --help
      std::fprintf(stderr, "pipetrain: profile-link: %s (see --help)\n",
                   Printable(e.what()).c_str());
      return exit_code::kUsage;
    }
    return run::RunLinkCommand(flags);
  }
  CLI::App app{
      "pipetrain-run: trains a job on this machine without daemons, each pipeline "
      "stage of each replica a thread of this process (or a process of its own with "
      "--launch processes). `pipetrain run --launch threads|processes` runs this. With "
      "no arguments: the built-in GPT on the built-in corpus, 4 stages, PipeDream-2BW."};
  app.set_version_flag("--version", "pipetrain " PIPETRAIN_VERSION);
  run_main::RunnerFlags flags;
  run_main::AddRunnerFlags(&app, flags);
  jobspec::SpecFlags spec_flags(&app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "pipetrain: %s (see --help)\n", Printable(e.what()).c_str());
    return exit_code::kUsage;
  }
  return run_main::Run(flags, spec_flags, argv[0]);
}
