// The options of `pipetrain plan` / `pipetrain profile` and of a job with `stages: auto`:
// which workers to plan for and what to print. Taken by the pipetrain CLI (which links no
// LibTorch) and handed on to pipetrain-run (AsArgs), which profiles and plans
// (plan_command.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_join.h"

namespace pipetrain::jobspec {

struct PlanFlags {
  bool plan = false;
  bool profile = false;
  bool predict = false;                // the job's own layout, predicted (no search)
  int workers = 0;                     // 0: this machine's cores
  int64_t memory_per_worker = 0;       // 0: not limited
  int shared_cores = -1;               // -1: this machine's cores (every worker runs here)
  std::vector<int> micro_batch_sizes;  // empty: every divisor of the global batch
  std::vector<int> hosts;              // workers on each host (empty: all on one)
  std::string host_links;              // pipetrain profile-link's JSON ("": the profile's)
  std::string output = "text";
  bool no_cache = false;
  bool quiet = false;

  // Where the flags go: pipetrain-run (all, with --plan and --profile), `pipetrain plan` and
  // `profile` (--workers, not --plan-workers), `pipetrain run` (what `stages: auto` uses).
  enum class Where { kRunner, kPlanCommand, kRunCommand };

  void AddTo(CLI::App* app, Where where) {
    auto* g = app->add_option_group("planning (stages: auto)");
    const bool with_mode_flags = where == Where::kRunner;
    if (with_mode_flags) {
      g->add_flag("--plan", plan, "plan the job (pipetrain plan) instead of running it");
      g->add_flag("--profile", profile,
                  "print the job's model profile (JSON) instead of running it");
    }
    // `pipetrain plan --workers`; elsewhere --plan-workers (`run` has --workers).
    if (where != Where::kRunCommand) {
      g->add_flag("--predict", predict,
                  "predict the step time and per-stage memory of the job's own layout "
                  "(its stages, replicas, micro-batches, schedule, recompute) instead of "
                  "choosing one");
    }
    g->add_option(where == Where::kPlanCommand ? "--workers" : "--plan-workers", workers,
                  "workers (one rank each) to plan for (default: this machine's cores)")
        ->check(CLI::Range(1, 4096));
    g->add_option("--memory-per-worker", memory_per_worker,
                  "memory of each worker, e.g. 8GiB or 500000000; plans fill at most 90% of "
                  "it (default: not limited)")
        ->transform(CLI::AsSizeValue(false));
    g->add_option("--shared-cores", shared_cores,
                  "cores all workers share (they run on one machine); 0: each has its own "
                  "(default: this machine's cores)");
    g->add_option("--microbatch-sizes", micro_batch_sizes,
                  "micro-batch sizes to consider (default: every divisor of the global batch)")
        ->delimiter(',');
    g->add_option("--hosts", hosts,
                  "workers on each host, e.g. 2,2,2: ranks are placed on the hosts, the "
                  "heaviest traffic kept within them (default: every worker on one host; "
                  "sets the workers to their sum)")
        ->delimiter(',')
        ->check(CLI::Range(1, 4096));
    g->add_option("--host-links", host_links,
                  "the links between hosts, as `pipetrain profile-link` printed them "
                  "(default: the profile's between_hosts, else as within a host)")
        ->check(CLI::ExistingFile);
    if (where != Where::kRunCommand) {
      g->add_option("-o,--output", output, "text | json")
          ->check(CLI::IsMember({"text", "json"}))
          ->capture_default_str();
    }
    g->add_flag("--no-cache", no_cache, "measure again instead of using cached profiles");
  }

  std::vector<std::string> AsArgs() const {
    std::vector<std::string> args;
    if (plan) args.push_back("--plan");
    if (profile) args.push_back("--profile");
    if (predict) args.push_back("--predict");
    if (workers > 0) args.insert(args.end(), {"--plan-workers", std::to_string(workers)});
    if (memory_per_worker > 0) {
      args.insert(args.end(), {"--memory-per-worker", std::to_string(memory_per_worker)});
    }
    args.insert(args.end(), {"-o", output});
    if (shared_cores >= 0)
      args.insert(args.end(), {"--shared-cores", std::to_string(shared_cores)});
    if (!micro_batch_sizes.empty()) {
      args.insert(args.end(), {"--microbatch-sizes", absl::StrJoin(micro_batch_sizes, ",")});
    }
    if (!hosts.empty()) args.insert(args.end(), {"--hosts", absl::StrJoin(hosts, ",")});
    if (!host_links.empty()) args.insert(args.end(), {"--host-links", host_links});
    if (no_cache) args.push_back("--no-cache");
    return args;
  }
};

}  // namespace pipetrain::jobspec
