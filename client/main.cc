// pipetrain: the command-line interface.
//
//   pipetrain run [JOB.yaml] [flags]   train on this machine: a local cluster (a coordinator
//                                      and one worker process per rank), or with
//                                      --launch threads|processes, pipetrain-run (no daemons)
//   pipetrain plan|profile [JOB.yaml]  profile the model and plan its layout (pipetrain-run)
//   pipetrain profile-link             measure the links between two hosts (pipetrain-run)
//   pipetrain submit|status|list|logs|cancel|flush|switch|checkpoint|stop|workers|health
//
// The CLI builds job specs (jobspec/) and speaks to daemons (proto/, rpc/); the training
// runtime is in pipetrain-run and the daemons, which it finds beside itself (see
// local_cluster.h), so it links no LibTorch and starts in milliseconds.
// Exit codes (runtime/base/exit_codes.h, shared with pipetrain-run): 0 ok, 1 the job failed,
// 2 bad usage or invalid job, 3 not found, 4 unauthenticated or denied, 5 unavailable,
// 130 interrupted.
#include <csignal>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "client/jobs.h"
#include "client/run_command.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"
#include "runtime/base/uncaught_exceptions.h"

int main(int argc, char** argv) {
  using namespace pipetrain;
  ReportUncaughtExceptions("pipetrain");
  std::signal(SIGINT, [](int) { std::_Exit(exit_code::kInterrupted); });
  CLI::App app{
      "pipetrain: pipeline-parallel training with exact semantics (GPipe, "
      "1F1B-Flush, PipeDream-2BW and PipeDream's weight stashing, interleaved 1F1B, "
      "zero-bubble, ZB-V, DualPipeV). `pipetrain run` trains on this machine; the "
      "other commands talk to a coordinator."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pipetrain " PIPETRAIN_VERSION);
  std::function<int()> run_command = client::AddRunCommand(app);
  std::function<int()> plan_command = client::AddPlanCommands(app);
  std::function<int()> link_command = client::AddLinkCommand(app);
  std::function<int()> job_command = client::AddJobCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // One line, as every other error of the CLI: "pipetrain: WHY".
    std::fprintf(stderr, "pipetrain: %s (--help says what each command takes)\n",
                 Printable(e.what()).c_str());
    return exit_code::kUsage;
  }
  if (app.got_subcommand("run")) return run_command();
  if (app.got_subcommand("plan") || app.got_subcommand("profile")) return plan_command();
  if (app.got_subcommand("profile-link")) return link_command();
  return job_command();
}
