// `pipetrain run` on a local cluster: a pipetrain-coordinator and one pipetrain-worker per
// rank of the job, each a process of its own on loopback (plaintext, no token: nothing
// listens beyond this machine), with their logs in a temporary directory. The job is
// submitted, followed with progress on stderr, and then every process is stopped (SIGTERM;
// SIGKILL after 10 s), also when the job fails. The daemons die with this process (they
// are told to by the kernel if it is killed). The daemons are looked up beside the pipetrain
// binary (also as built: ../coordinator, ../worker), then on PATH.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

struct LocalClusterRun {
  v1::JobSpec spec;
  int workers = 0;         // 0: as many as the job has ranks (stages x replicas)
  bool keep_logs = false;  // keep the log directory even when the job succeeds
  bool quiet = false;      // no progress, no table
  // When set, written once the job has succeeded: a JSON report of the job as the
  // coordinator last saw it (with the job as it ran under "config"), and the whole model's
  // final weights (as pipetrain-run --save-weights writes them; the stage files are gathered
  // from the job's weights_dir, a directory beside the logs if the spec has none).
  std::string summary_file;
  std::string weights_file;
};

// Returns the CLI exit code: 0 succeeded, 1 failed, 2 invalid spec, 5 a daemon did not start.
int RunOnLocalCluster(const LocalClusterRun& run);

// The executable `name` beside this binary, in the build tree's folders (../coordinator,
// ../worker), or on PATH; "" if nowhere.
std::string FindDaemon(const std::string& name);

// For `stages: auto` on daemons: the model profile of `spec` measured on this machine by
// pipetrain-run (`pipetrain profile`, JSON; its progress on stderr unless `quiet`).
// Unavailable if pipetrain-run cannot be found or started; its error otherwise.
absl::StatusOr<std::string> MeasureModelProfile(const v1::JobSpec& spec, bool quiet);

}  // namespace pipetrain::client
