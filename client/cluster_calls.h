// `pipetrain run`'s calls to the local cluster it started (client/local_cluster.h):
// plaintext loopback, sending $PIPETRAIN_TOKEN if it is set (the daemons it starts inherit
// it, and then ask for it). Each call makes its own channel; thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "pipetrain/v1/job_service.pb.h"

namespace pipetrain::client {

// Submits `spec` to the coordinator at `address` and fills `job` (stages and replicas
// resolved); on failure prints why and returns the exit code, else 0.
// `model_profile_json`: for a spec with `stages: auto` (MeasureModelProfile).
int SubmitJob(const std::string& address, const v1::JobSpec& spec, v1::Job* job,
              const std::string& model_profile_json = "");
// Waits until `workers` workers are registered with the coordinator at `address` (a local
// cluster's, before a `stages: auto` job is planned for them); 0, or the exit code after
// saying why (5 if `timeout` passes).
int WaitForWorkers(const std::string& address, int workers, absl::Duration timeout);
// Follows job `id` until it ends, with progress on stderr, then prints its table (as
// `status` does) unless `quiet`, and fills `job` with its last state; 0 if it succeeded, 1 if
// it failed or was cancelled, the exit code of the RPC failure otherwise.
int FollowJob(const std::string& address, const std::string& id, bool quiet, v1::Job* job);
// Every step job `id` committed, in order (ListSteps, page by page).
absl::StatusOr<std::vector<v1::CommittedStep>> CommittedSteps(const std::string& address,
                                                              const std::string& id);

}  // namespace pipetrain::client
