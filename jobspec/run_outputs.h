// The options of a training run that are not part of the job: what it writes at the end and
// how much it says. Taken by `pipetrain run` (every launch mode) and by pipetrain-run, to
// which `pipetrain run --launch threads|processes` hands them on (AsArgs).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace pipetrain::jobspec {

struct RunOutputs {
  std::string summary;       // JSON report
  std::string trace;         // Chrome trace (threads, processes)
  std::string save_weights;  // the whole model's final parameters, then buffers
  bool reference = false;    // also train the un-pipelined model (threads, processes)
  bool quiet = false;
  bool dry_run = false;  // print the job as the runtime takes it, run nothing

  void AddTo(CLI::App* app) {
    auto* g = app->add_option_group("output");
    g->add_option("--summary", summary,
                  "write a JSON report here at the end (with the job "
                  "as it ran under \"config\")");
    g->add_option("--trace", trace,
                  "write the timeline of every action and AllReduce of every stage here at "
                  "the end (Chrome trace JSON: open in ui.perfetto.dev or chrome://tracing; "
                  "threads and processes)");
    g->add_option("--save-weights", save_weights,
                  "write the final parameters of the whole model (layer order, then buffers) "
                  "here at the end (torch::save of a tensor list)");
    g->add_flag("--reference", reference,
                "also train the un-pipelined model and report max_param_rel_diff (threads "
                "and processes)");
    g->add_flag("-q,--quiet", quiet, "no progress, no summary table");
    g->add_flag("--dry-run", dry_run,
                "print the job as the runtime takes it (JSON, every field, defaults "
                "applied) and exit without running it");
  }

  // The command-line arguments that set these options.
  std::vector<std::string> AsArgs() const {
    std::vector<std::string> args;
    const std::pair<const char*, const std::string*> files[] = {
        {"--summary", &summary}, {"--trace", &trace}, {"--save-weights", &save_weights}};
    for (const auto& [flag, value] : files) {
      if (!value->empty()) args.insert(args.end(), {flag, *value});
    }
    if (reference) args.push_back("--reference");
    if (quiet) args.push_back("--quiet");
    if (dry_run) args.push_back("--dry-run");
    return args;
  }
};

}  // namespace pipetrain::jobspec
