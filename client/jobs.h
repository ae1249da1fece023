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

namespace pipetrain::client {

// Adds the subcommands to `app`; returns the function that runs whichever was chosen
// (returning the exit code), or -1 if none of them was.
std::function<int()> AddJobCommands(CLI::App& app);

}  // namespace pipetrain::client
