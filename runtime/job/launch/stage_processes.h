// Runs a job with one OS process per pipeline stage on this machine, over the Gloo
// transport: the same job, schedule, report and reference check as RunInProcess.
//
// The launcher serves the rendezvous store (a TCP store on loopback), starts one process per
// (replica, stage), rank = replica * stages + stage, by re-running `command` with
// `--stage-process RANK --store-port P --result-dir D`
// appended, follows progress through the store, and waits. When a stage process fails or
// dies, the others stop within their deadline (a dead peer fails their receives at once);
// the launcher gives them `stop_grace` and then kills them, so none is left behind (and a
// stage process dies with the launcher if the launcher itself is stopped). The
// error names every stage's outcome, e.g. "stage 1 (pid 4242) was killed by signal 9;
// stage 0: stage 0 lost stage 1 (rank 1) while waiting for ...".
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/report/report.h"

namespace pipetrain::job {

struct ProcessRunOptions {
  // argv that runs this same job (argv[0] is replaced by this executable's own path).
  std::vector<std::string> command;
  std::function<void(const Progress&)> on_progress;
  absl::Duration stop_grace = absl::Seconds(10);
};

absl::StatusOr<JobReport> RunAsProcesses(const JobSpec& config, const ProcessRunOptions& options);

// What a stage process is told by the launcher.
struct StageProcessArgs {
  int rank = 0;  // replica * stages + stage
  int store_port = 0;
  std::string result_dir;
};

// The body of one stage process: builds its stage, joins the data plane, runs, and leaves
// its measurements and final weights in `result_dir` for the launcher. An error it could
// hand to the launcher carries the payload kReportedToLauncher (no need to print it).
extern const char kReportedToLauncher[];
absl::Status RunStageProcess(const JobSpec& config, const StageProcessArgs& args);

}  // namespace pipetrain::job
