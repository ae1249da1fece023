// `pipetrain profile-link`: measures the Gloo links between this host and another, the input
// the planners and the coordinator's placement take as the links between hosts
// (planner::HostLinks; docs/planning.md "Hosts"). One side listens, the other connects:
//
//   host A:  pipetrain profile-link --listen 10.0.0.1 [--port 29600] [-o links.json]
//   host B:  pipetrain profile-link --connect 10.0.0.1:29600 --address 10.0.0.2
//
// The listening side prints the links as JSON (planner/profile_json.h, HostLinksToJson) once
// both are done; every wait for the other side ends within 60 s. The pipetrain CLI (no
// LibTorch) takes the flags and hands them to `pipetrain-run profile-link`, which measures.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace pipetrain::run {

struct LinkFlags {
  std::string listen;   // this host's address: lead the measurement
  int port = 0;         // the leader's two ports: port and port + 1 (0: any two free ones)
  std::string connect;  // ADDRESS:PORT or ADDRESS:PORT,PORT2 of the leader: follow it
  std::string address;  // the follower's own address (where the leader reaches it)
  std::string output;   // the leader's JSON goes here ("": stdout)

  // The options, on `app` (pipetrain-run's or the pipetrain CLI's subcommand).
  void AddTo(CLI::App* app) {
    auto* g = app->add_option_group("links between hosts (profile-link)");
    g->add_option("--listen", listen,
                  "this host's address: lead the measurement and print the links (JSON)");
    g->add_option("--port", port,
                  "with --listen: the ports to listen on, PORT and PORT+1 "
                  "(default: any two free ones, printed)")
        ->check(CLI::Range(0, 65534));
    g->add_option("--connect", connect,
                  "ADDRESS:PORT[,PORT] of the side that listens (as it printed): follow it");
    g->add_option("--address", address,
                  "with --connect: this host's address, where the listening side reaches it");
    g->add_option("-o,--output", output, "with --listen: write the JSON here (default: stdout)");
  }

  // Them again as arguments (the pipetrain CLI hands them to pipetrain-run).
  std::vector<std::string> AsArgs() const {
    std::vector<std::string> args;
    if (!listen.empty()) args.insert(args.end(), {"--listen", listen});
    if (port > 0) args.insert(args.end(), {"--port", std::to_string(port)});
    if (!connect.empty()) args.insert(args.end(), {"--connect", connect});
    if (!address.empty()) args.insert(args.end(), {"--address", address});
    if (!output.empty()) args.insert(args.end(), {"--output", output});
    return args;
  }
};

// Exit codes as runtime/base/exit_codes.h: 0, 2 for bad flags, 1 when the measurement fails.
int RunLinkCommand(const LinkFlags& flags);

}  // namespace pipetrain::run
