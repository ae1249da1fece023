#include "run/link_command.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/host_port.h"
#include "runtime/base/printable.h"
#include "runtime/planner/profile_json.h"
#include "runtime/profiler/machine_profiling.h"

namespace pipetrain::run {
namespace {

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "pipetrain: profile-link: %s\n", Printable(message).c_str());
  return code;
}

struct Leader {
  std::string address;
  int p2p_port = 0, replica_port = 0;
};

// ADDRESS:PORT (the stores at PORT and PORT + 1) or ADDRESS:PORT,PORT2.
absl::StatusOr<Leader> ParseLeader(const std::string& text) {
  Leader leader;
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("--connect ", text,
                     ": expected ADDRESS:PORT or ADDRESS:PORT,PORT (what --listen printed)"));
  };
  // The second port follows the first after a comma.
  const std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits(',', 1));
  const absl::StatusOr<HostPort> first = ParseHostPort(parts[0], 1);
  if (!first.ok() || first->host.empty()) return bad();
  leader.address = first->host;
  leader.p2p_port = first->port;
  leader.replica_port = leader.p2p_port + 1;
  if (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &leader.replica_port)) return bad();
  if (leader.replica_port < 1 || leader.replica_port > 65535) return bad();
  return leader;
}

}  // namespace

int RunLinkCommand(const LinkFlags& flags) {
  if (flags.listen.empty() == flags.connect.empty()) {
    return Fail(
        "give either --listen ADDRESS (on one host) or --connect ADDRESS:PORT "
        "--address ADDRESS (on the other)",
        exit_code::kUsage);
  }
  if (!flags.connect.empty()) {
    absl::StatusOr<Leader> leader = ParseLeader(flags.connect);
    if (!leader.ok()) return Fail(std::string(leader.status().message()), exit_code::kUsage);
    if (flags.address.empty()) {
      return Fail(
          "--connect needs --address: this host's address, where the other side "
          "reaches it",
          exit_code::kUsage);
    }
    const absl::Status s = profiler::RunHostLinkPeer(leader->address, leader->p2p_port,
                                                     leader->replica_port, flags.address);
    if (absl::IsFailedPrecondition(s)) {
      // Something else listens there: the address is wrong.
      return Fail(absl::StrCat(s.message(),
                               "; --connect takes what `pipetrain profile-link "
                               "--listen ADDRESS` printed on the other host"),
                  exit_code::kUsage);
    }
    if (!s.ok()) return Fail(std::string(s.message()), exit_code::For(s));
    return exit_code::kOk;
  }
  profiler::HostLinkLeader leader;
  leader.address = flags.listen;
  leader.port = flags.port;
  leader.on_listening = [&](int p2p_port, int replica_port) {
    std::fprintf(stderr,
                 "profile-link: waiting (60 s) for the other host: there run\n"
                 "  pipetrain profile-link --connect %s:%d,%d --address <its address>\n",
                 flags.listen.c_str(), p2p_port, replica_port);
  };
  absl::StatusOr<planner::HostLinks> links = profiler::ProfileHostLinks(leader);
  if (!links.ok()) return Fail(std::string(links.status().message()), exit_code::kJobFailed);
  std::fprintf(stderr,
               "profile-link: point to point %.0f us + %.1f MB/s; 2-rank AllReduce %.0f us + "
               "%.1f MB/s\n",
               links->p2p.latency_s * 1e6, links->p2p.bytes_per_s / 1e6,
               links->allreduce.latency_s * 1e6, links->allreduce.bytes_per_s / 1e6);
  const std::string json = planner::HostLinksToJson(*links);
  if (flags.output.empty()) {
    std::printf("%s\n", json.c_str());
    return exit_code::kOk;
  }
  if (absl::Status s = WriteFileAtomically(flags.output, json + "\n"); !s.ok()) {
    return Fail(std::string(s.message()), exit_code::kJobFailed);
  }
  return exit_code::kOk;
}

}  // namespace pipetrain::run
