// The CLI's job commands, talking to a coordinator over gRPC: submit, status, list, logs,
// cancel, workers, health. Every command takes --coordinator (default: $PIPETRAIN_COORDINATOR
// or 127.0.0.1:7070) and -o table|json.
//
// Exit codes: 0 ok, 1 job failed, 2 bad usage or invalid spec, 3 not found,
// 4 unauthenticated or denied, 5 unavailable or deadline exceeded.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace pipetrain::client {

// Adds the subcommands to `app`; returns the function that runs whichever was chosen
// (returning the exit code), or -1 if none of them was.
std::function<int()> AddJobCommands(CLI::App& app);

}  // namespace pipetrain::client
