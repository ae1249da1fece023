// The CLI's job commands, talking to a coordinator over gRPC: submit, status, metrics, list,
// logs, cancel, workers, health. Every command takes --coordinator (default:
// $PIPETRAIN_COORDINATOR or 127.0.0.1:7070), -o table|json, --token-file (default:
// $PIPETRAIN_TOKEN) and --tls-ca/--tls-cert/--tls-key (rpc/security.h). Token and TLS files
// are read before any call; an unreadable one is bad usage (2). A call the coordinator
// refuses for a missing or wrong token exits 4 with one line naming the coordinator.
//
// Exit codes: the table in runtime/base/exit_codes.h (0 ok, 1 job failed, 2 bad usage or
// invalid spec, 3 not found, 4 unauthenticated or denied, 5 unavailable or deadline
// exceeded), a failed call's through rpc::ToAbslStatus.
#pragma once

#include <functional>

#include <string>

#include <CLI/CLI.hpp>

#include "absl/time/time.h"
#include "pipetrain/v1/job_service.pb.h"

namespace pipetrain::client {

// Adds the subcommands to `app`; returns the function that runs whichever was chosen
// (returning the exit code), or -1 if none of them was.
std::function<int()> AddJobCommands(CLI::App& app);

// For `pipetrain run` on a local cluster (plaintext loopback; $PIPETRAIN_TOKEN, if set, is
// sent, since the daemons it starts inherit it and ask for it): submits `spec` to
// the coordinator at `address` and fills `job` (stages and replicas resolved); on failure
// prints why and returns the exit code, else 0.
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

}  // namespace pipetrain::client
