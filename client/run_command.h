// `pipetrain run [JOB.yaml] [flags]`: trains a job on this machine. The CLI builds the job
// spec itself (the job file, then the flags of jobspec/spec_flags.h over it) and validates
// it, so every launch mode takes the same job:
//   --launch cluster (default)  a local cluster: a pipetrain-coordinator and one
//                               pipetrain-worker per rank (local_cluster.h); the spec is
//                               submitted as `pipetrain submit` would
//   --launch threads|processes  pipetrain-run, which this process becomes, handed the spec
//                               (no daemons)
// Every key means the same in each mode (name, weights_dir included); --summary and
// --save-weights work in each, --trace and --reference without daemons.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace pipetrain::client {

// Adds the `run` subcommand to `app`; returns the function that runs it (returning the
// exit code).
std::function<int()> AddRunCommand(CLI::App& app);

// Adds `plan` and `profile` (handed over to pipetrain-run, run/plan_command.h); returns the
// function that runs the one given.
std::function<int()> AddPlanCommands(CLI::App& app);

// Adds `profile-link` (handed over to pipetrain-run, run/link_command.h); returns the function
// that runs it.
std::function<int()> AddLinkCommand(CLI::App& app);

}  // namespace pipetrain::client
