// pipetrain-run: runs a job on this machine without daemons, every stage of every replica a
// thread of this process (--launch threads) or a process of its own over Gloo (--launch
// processes). `pipetrain run --launch threads|processes ...` runs it; `pipetrain run` on its
// local cluster asks it for the job file its flags make (--print-job-yaml).
//
//   pipetrain-run [JOB.yaml] [flags]
//
// Exit codes (runtime/base/exit_codes.h, shared with the pipetrain CLI): 0 ok, 1 the job
// failed, 2 bad usage or invalid job, 3 a file it names is not found, 130 interrupted.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "runtime/base/allocator.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/progress_line.h"
#include "runtime/job/local_run.h"
#include "runtime/job/process_run.h"
#include "runtime/job/trace.h"

namespace pipetrain::run_main {
namespace {

// 1536 -> "1.5 KiB", 0 -> "-" (not measured).
std::string FormatBytes(int64_t bytes) {
  if (bytes <= 0) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  for (; v >= 1024 && u < 4; ++u) v /= 1024;
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

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

nlohmann::json ReportToJson(const job::JobReport& r) {
  nlohmann::json j;
  j["schedule"] = r.schedule;
  j["stages"] = r.stages;
  j["replicas"] = r.replicas;
  j["microbatches"] = r.micro_batches;
  j["microbatch_size"] = r.micro_batch_size;
  j["steps"] = r.steps;
  j["model"] = r.model_summary;
  j["data"] = r.data_summary;
  j["partition"] = nlohmann::json::array();
  for (const auto& range : r.partition) j["partition"].push_back({range.begin, range.end});
  j["losses"] = r.losses;
  j["first_loss"] = r.losses.front();
  j["final_loss"] = r.losses.back();
  if (r.data_entropy) j["data_entropy"] = *r.data_entropy;
  j["step_time_s"] = r.step_time_s;
  j["ideal_step_time_s"] = r.ideal_step_time_s;
  if (r.replicas > 1) {
    j["allreduce_s"] = r.allreduce_s;
    j["exposed_allreduce_s"] = r.exposed_allreduce_s;
  }
  j["pipeline_efficiency"] = r.step_time_s > 0 ? r.ideal_step_time_s / r.step_time_s : 0.0;
  j["samples_per_s"] = r.samples_per_s;
  if (r.token_data) j["tokens_per_s"] = r.tokens_per_s;
  j["wall_s"] = r.wall_s;
  j["threads_per_stage"] = r.threads_per_stage;
  j["per_stage"] = nlohmann::json::array();
  for (const auto& s : r.per_stage) {
    j["per_stage"].push_back({{"stage", s.stage},
                              {"layers", {s.layers.begin, s.layers.end}},
                              {"peak_stashed_microbatches", s.peak_stashed_microbatches},
                              {"peak_weight_versions", s.peak_weight_versions},
                              {"compute_s", s.compute_s},
                              {"wait_s", s.wait_s},
                              {"allreduce_s", s.allreduce_s},
                              {"parameter_bytes", s.parameter_bytes},
                              {"peak_memory_bytes", s.peak_memory_bytes}});
  }
  if (r.max_param_rel_diff) j["max_param_rel_diff"] = *r.max_param_rel_diff;
  return j;
}

void PrintSummary(const job::JobReport& r) {
  std::printf("\n%s | %s\n", r.model_summary.c_str(), r.data_summary.c_str());
  std::printf("schedule %s, %d stages (%s) x %d replicas, %d micro-batches of %d, %d steps\n",
              r.schedule.c_str(), r.stages, model::FormatRanges(r.partition).c_str(),
              r.replicas, r.micro_batches, r.micro_batch_size, r.steps);
  std::printf("loss %.4f -> %.4f", r.losses.front(), r.losses.back());
  if (r.data_entropy) {
    const double gap = r.losses.front() - *r.data_entropy;
    std::printf("   (entropy %.4f: %.1f%% of the gap closed)", *r.data_entropy,
                gap > 0 ? 100.0 * (r.losses.front() - r.losses.back()) / gap : 0.0);
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
                absl::StrCat(s.layers.begin, ":", s.layers.end).c_str(),
                s.peak_stashed_microbatches, s.peak_weight_versions, s.compute_s, s.wait_s,
                FormatBytes(s.parameter_bytes).c_str(), FormatBytes(s.peak_memory_bytes).c_str());
  }
  if (r.max_param_rel_diff) {
    std::printf("max relative parameter difference vs. the un-pipelined reference: %.3g\n",
                *r.max_param_rel_diff);
  }
}

struct RunFlags {
  std::string job_file, summary_file, trace_file, weights_file;
  std::string launch = "threads";
  bool print_job_yaml = false;
  bool reference = false, quiet = false;
  std::vector<std::string> argv;  // the whole command line, to start stage processes
  // Set by the launcher in the stage processes it starts.
  int stage_process = -1;
  int store_port = 0;
  std::string result_dir;
};

// A flag that overrides one field of the job: values given on the command line win over the
// job file, which wins over the defaults.
struct Override {
  CLI::Option* option;
  std::function<absl::Status(job::JobConfig&)> apply;
};

int Run(const RunFlags& flags, const std::vector<Override>& overrides) {
  job::JobConfig config;
  if (!flags.job_file.empty()) {
    auto loaded = job::LoadJobYaml(flags.job_file);
    if (!loaded.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(loaded.status().message()).c_str());
      return exit_code::For(loaded.status());
    }
    config = *loaded;
  }
  std::vector<std::string> errors;
  for (const Override& o : overrides) {
    if (o.option->count() == 0) continue;
    if (absl::Status s = o.apply(config); !s.ok()) {
      errors.push_back(absl::StrCat(o.option->get_name(), ": ", s.message()));
    }
  }
  if (!errors.empty()) {
    std::fprintf(stderr, "error: %s\n", absl::StrJoin(errors, "; ").c_str());
    return exit_code::kUsage;
  }
  if (absl::Status s = job::ValidateJobConfig(config); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return exit_code::kUsage;
  }

  if (flags.stage_process >= 0) {
    absl::Status s = job::RunStageProcess(
        config, {flags.stage_process, flags.store_port, flags.result_dir});
    if (!s.ok()) {
      if (!s.GetPayload(job::kReportedToLauncher)) {  // else the launcher reports it
        std::fprintf(stderr, "error: rank %d: %s\n", flags.stage_process,
                     std::string(s.message()).c_str());
      }
      return exit_code::kJobFailed;
    }
    return exit_code::kOk;
  }

  if (flags.print_job_yaml) {
    std::fputs(job::JobConfigToYaml(config).c_str(), stdout);
    return exit_code::kOk;
  }
  const bool token_data = job::EffectiveDataKind(config) != "classification";
  ProgressPrinter printer(flags.quiet, token_data);
  absl::StatusOr<job::JobReport> report;
  if (flags.launch == "processes") {
    job::ProcessRunOptions options;
    options.command = flags.argv;
    options.on_progress = std::ref(printer);
    report = job::RunAsProcesses(config, options);
  } else {
    job::RunOptions options;
    options.on_progress = std::ref(printer);
    report = job::RunInProcess(config, options);
  }
  if (!report.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(report.status().message()).c_str());
    return exit_code::ForJob(report.status());
  }
  if (flags.reference) {
    if (!flags.quiet) std::fprintf(stderr, "training the un-pipelined reference...\n");
    auto reference = job::TrainReference(config);
    if (!reference.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(reference.status().message()).c_str());
      return exit_code::kJobFailed;
    }
    report->max_param_rel_diff = job::MaxRelativeDifference(report->final_parameters, *reference);
  }
  if (!flags.quiet) PrintSummary(*report);
  if (!flags.summary_file.empty()) {
    if (absl::Status s = WriteFileAtomically(flags.summary_file, ReportToJson(*report).dump(2));
        !s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return exit_code::kJobFailed;
    }
  }
  if (!flags.trace_file.empty()) {
    if (absl::Status s = WriteFileAtomically(flags.trace_file, job::ChromeTraceJson(*report));
        !s.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
      return exit_code::kJobFailed;
    }
  }
  if (!flags.weights_file.empty()) {
    try {
      std::vector<at::Tensor> tensors = report->final_parameters;
      tensors.insert(tensors.end(), report->final_buffers.begin(), report->final_buffers.end());
      torch::save(tensors, flags.weights_file);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: writing %s: %s\n", flags.weights_file.c_str(), e.what());
      return exit_code::kJobFailed;
    }
  }
  return exit_code::kOk;
}

// Binds the flags that each override one field of the job to `overrides`: values given on
// the command line win over the job file, which wins over the defaults.
class JobFlags {
 public:
  explicit JobFlags(std::vector<Override>* overrides) : overrides_(overrides) {}
  const job::JobConfig& defaults() const { return defaults_; }

  // Binds a flag to the job field `get` returns: copied into the job only when given.
  template <typename Get>
  void Field(CLI::Option_group* group, const char* name, const char* help, Get get) {
    job::JobConfig probe = defaults_;
    using T = std::decay_t<decltype(get(probe))>;
    auto value = std::make_shared<T>(get(probe));
    auto* option = group->add_option(name, *value, help)->capture_default_str();
    overrides_->push_back({option, [value, get](job::JobConfig& c) {
                             get(c) = *value;
                             return absl::OkStatus();
                           }});
  }
  // A flag whose text is parsed by `apply` into the job.
  template <typename Apply>
  void Parsed(CLI::Option_group* group, const char* name, std::string default_text,
              const char* help, Apply apply) {
    auto text = std::make_shared<std::string>();
    auto* option = group->add_option(name, *text, help)->default_str(default_text);
    overrides_->push_back({option, [text, apply](job::JobConfig& c) { return apply(c, *text); }});
  }

 private:
  const job::JobConfig defaults_;
  std::vector<Override>* overrides_;
};

// The run's own flags: files it writes, the launch, quiet, and the internal ones.
void AddRunFlags(CLI::App* run, RunFlags& flags) {
  run->add_option("job", flags.job_file, "YAML job file (flags given too override it)")
      ->check(CLI::ExistingFile);
  run->add_option("--summary", flags.summary_file, "write a JSON report here at the end");
  run->add_option("--trace", flags.trace_file,
                  "write the timeline of every action and AllReduce of every stage here at the "
                  "end (Chrome trace JSON: open in ui.perfetto.dev or chrome://tracing)");
  run->add_option("--save-weights", flags.weights_file,
                  "write the final parameters of the whole model (layer order, then buffers) "
                  "here at the end (torch::save of a tensor list)");
  run->add_flag("--reference", flags.reference,
                "also train the un-pipelined model and report max_param_rel_diff");
  run->add_flag("-q,--quiet", flags.quiet, "no progress, no summary table");
  run->add_option("--launch", flags.launch,
                  "threads: all stages in this process; processes: one process per stage, "
                  "connected by Gloo over loopback TCP")
      ->check(CLI::IsMember({"threads", "processes"}))
      ->capture_default_str();
  // Set by `pipetrain run` on a local cluster: print the job (file, flags applied) and exit.
  run->add_flag("--print-job-yaml", flags.print_job_yaml)->group("");
  auto* internal = run->add_option_group("");  // set by --launch processes, not for users
  internal->add_option("--stage-process", flags.stage_process);
  internal->add_option("--store-port", flags.store_port);
  internal->add_option("--result-dir", flags.result_dir);
}

// The model: which one and its sizes.
void AddModelFlags(CLI::App* run, JobFlags& f) {
  const job::JobConfig& defaults = f.defaults();
  auto* m = run->add_option_group("model");
  f.Parsed(m, "--model", defaults.model.name, "gpt | mlp | cnn | torchscript",
           [](job::JobConfig& c, const std::string& v) {
             c.model.name = v;
             return absl::OkStatus();
           });
  f.Parsed(m, "--torchscript", "", "TorchScript file of an nn.Sequential (implies --model "
           "torchscript)", [](job::JobConfig& c, const std::string& v) {
             c.model.name = "torchscript";
             c.model.torchscript_path = v;
             return absl::OkStatus();
           });
  f.Field(m, "--d-model", "gpt width",
          [](job::JobConfig& c) -> int64_t& { return c.model.d_model; });
  f.Field(m, "--n-heads", "gpt attention heads",
          [](job::JobConfig& c) -> int64_t& { return c.model.n_heads; });
  f.Field(m, "--n-layers", "gpt transformer blocks",
          [](job::JobConfig& c) -> int64_t& { return c.model.n_layers; });
  f.Field(m, "--hidden", "mlp width / cnn channels",
          [](job::JobConfig& c) -> int64_t& { return c.model.hidden; });
  f.Field(m, "--hidden-layers", "mlp/cnn hidden layers",
          [](job::JobConfig& c) -> int64_t& { return c.model.hidden_layers; });
  f.Field(m, "--dropout", "dropout probability (gpt)",
          [](job::JobConfig& c) -> double& { return c.model.dropout; });
}

// The data: kind, file, sequence length, vocabulary.
void AddDataFlags(CLI::App* run, JobFlags& f) {
  auto* d = run->add_option_group("data");
  f.Parsed(d, "--data", "synthetic (gpt) or classification (mlp, cnn)",
           "synthetic | bytes | uint16 | classification",
           [](job::JobConfig& c, const std::string& v) {
             c.data.kind = v;
             return absl::OkStatus();
           });
  f.Parsed(d, "--data-path", "", "file for bytes / uint16 data",
           [](job::JobConfig& c, const std::string& v) {
             c.data.path = v;
             return absl::OkStatus();
           });
  f.Field(d, "--seq-len", "tokens per sequence (T)",
          [](job::JobConfig& c) -> int64_t& { return c.data.seq_len; });
  f.Field(d, "--vocab", "synthetic vocabulary (uint16: 0 infers it)",
          [](job::JobConfig& c) -> int64_t& { return c.data.vocab; });
}

// The pipeline: schedule, stages, replicas, micro-batches, recomputation, threads, timeouts.
void AddPipelineFlags(CLI::App* run, JobFlags& f) {
  auto* p = run->add_option_group("pipeline");
  f.Parsed(p, "--schedule", "2bw", "gpipe | 1f1b (alias flush, last-stage) | 2bw",
           [](job::JobConfig& c, const std::string& v) -> absl::Status {
             auto kind = schedule::ParseScheduleKind(v);
             if (!kind.ok()) return kind.status();
             c.schedule = *kind;
             return absl::OkStatus();
           });
  f.Parsed(p, "--stages", "4", "number of stages (balanced split) or layer ranges: 0:2,2:4,4:7",
           [](job::JobConfig& c, const std::string& v) -> absl::Status {
             int count = 0;
             if (absl::SimpleAtoi(v, &count)) {
               c.stages = count;
               c.stage_ranges.clear();
               return absl::OkStatus();
             }
             auto ranges = model::ParseRanges(v);
             if (!ranges.ok()) return ranges.status();
             c.stage_ranges = *ranges;
             c.stages = static_cast<int>(ranges->size());
             return absl::OkStatus();
           });
  f.Field(p, "--replicas", "data-parallel replicas of the pipeline (w); gradients averaged",
          [](job::JobConfig& c) -> int& { return c.replicas; });
  f.Field(p, "--overlap-allreduce", "Hippie: stage 0 averages gradient buckets during its final "
          "backward (true/false)",
          [](job::JobConfig& c) -> bool& { return c.overlap_allreduce; });
  f.Field(p, "--bucket-kib", "gradient bucket size for the overlapped AllReduce",
          [](job::JobConfig& c) -> int64_t& { return c.bucket_kib; });
  f.Field(p, "--microbatches", "micro-batches per step (m)",
          [](job::JobConfig& c) -> int& { return c.micro_batches; });
  f.Field(p, "--microbatch-size", "rows per micro-batch (b)",
          [](job::JobConfig& c) -> int& { return c.micro_batch_size; });
  f.Parsed(p, "--recompute", "none", "none | all | stages:I,J | layers:I,J",
           [](job::JobConfig& c, const std::string& v) -> absl::Status {
             auto rc = job::ParseRecompute(v);
             if (!rc.ok()) return rc.status();
             c.recompute = *rc;
             return absl::OkStatus();
           });
  f.Field(p, "--threads-per-stage", "intra-op threads per stage (0: cores / stages)",
          [](job::JobConfig& c) -> int& { return c.threads_per_stage; });
  f.Field(p, "--timeout", "seconds any wait for a peer may last",
          [](job::JobConfig& c) -> double& { return c.recv_timeout_s; });
}

// Training: steps, optimizer, seed, dtype.
void AddTrainingFlags(CLI::App* run, JobFlags& f) {
  auto* t = run->add_option_group("training");
  f.Field(t, "--steps", "optimizer steps",
          [](job::JobConfig& c) -> int& { return c.steps; });
  f.Parsed(t, "--optimizer", "adamw", "adamw | sgd", [](job::JobConfig& c, const std::string& v) {
    c.optimizer.name = v;
    return absl::OkStatus();
  });
  f.Field(t, "--lr", "learning rate",
          [](job::JobConfig& c) -> double& { return c.optimizer.lr; });
  f.Field(t, "--momentum", "sgd momentum",
          [](job::JobConfig& c) -> double& { return c.optimizer.momentum; });
  f.Field(t, "--weight-decay",
          "weight decay: decoupled for adamw (AdamW's rule), coupled for sgd (added to the "
          "gradient, as torch.optim.SGD does)",
          [](job::JobConfig& c) -> double& { return c.optimizer.weight_decay; });
  f.Field(t, "--beta1", "adamw: decay of the first moment",
          [](job::JobConfig& c) -> double& { return c.optimizer.beta1; });
  f.Field(t, "--beta2", "adamw: decay of the second moment",
          [](job::JobConfig& c) -> double& { return c.optimizer.beta2; });
  f.Field(t, "--eps", "adamw: added to the denominator",
          [](job::JobConfig& c) -> double& { return c.optimizer.eps; });
  f.Field(t, "--seed", "initialization and data order",
          [](job::JobConfig& c) -> uint64_t& { return c.seed; });
  f.Parsed(t, "--dtype", "float32", "float32 | float64",
           [](job::JobConfig& c, const std::string& v) -> absl::Status {
             absl::StatusOr<bool> f64 = job::ParseFloat64Dtype(v);
             if (!f64.ok()) return f64.status();
             c.float64 = *f64;
             return absl::OkStatus();
           });
}

}  // namespace
}  // namespace pipetrain::run_main

int main(int argc, char** argv) {
  using namespace pipetrain;
  TuneAllocatorForTraining();
  std::signal(SIGINT, [](int) { std::_Exit(exit_code::kInterrupted); });
  CLI::App app{"pipetrain-run: trains a job on this machine without daemons, each pipeline "
               "stage of each replica a thread of this process (or a process of its own with "
               "--launch processes). `pipetrain run --launch threads|processes` runs this. With "
               "no arguments: the built-in GPT on the built-in corpus, 4 stages, PipeDream-2BW."};
  app.set_version_flag("--version", "pipetrain 0.1.0");

  run_main::RunFlags flags;
  std::vector<run_main::Override> overrides;
  run_main::JobFlags job_flags(&overrides);
  run_main::AddRunFlags(&app, flags);
  run_main::AddModelFlags(&app, job_flags);
  run_main::AddDataFlags(&app, job_flags);
  run_main::AddPipelineFlags(&app, job_flags);
  run_main::AddTrainingFlags(&app, job_flags);

  flags.argv.assign(argv, argv + argc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? exit_code::kOk : exit_code::kUsage;
  }
  return run_main::Run(flags, overrides);
}
