// Measures the machine's part of a profile (profiler.h): the Gloo links between two ranks on
// loopback, and how much computing on several cores at once slows each down; and the links
// between two hosts.
//
// The links are measured by two sides in step: side 0 (the caller) leads and keeps the
// results; side 1 runs in a process of its own (RunLinkPeer, as ranks run) or in a thread of
// the caller's. The measurements take the CPU for seconds and are run one at a time.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/planner/profile.h"

namespace pipetrain::profiler {

// The Gloo links between two ranks, as planner::ModelProfile holds them.
struct GlooLinks {
  planner::LinkProfile p2p, allreduce, allreduce_cpu;
  std::vector<planner::MessageCost> messages;
};

// Measures the links with side 1 in a process of its own when `peer_command` is given (it is
// run with the two stores' ports appended and must call RunLinkPeer with them), else in a
// thread of this process. Internal when the peer cannot be started, dies or reports what does
// not parse; the stores' and the transport's errors (e.g. DeadlineExceeded after 60 s without
// the peer) as they are.
absl::StatusOr<GlooLinks> ProfileGlooLinks(const std::vector<std::string>& peer_command);

// The links between this host and another (pipetrain profile-link), each side a process on
// its own host, its transport listening on that host's address: this side (the leader) serves
// two stores on `address` (ports `port` and `port` + 1; 0: any two free ones), tells
// `on_listening` their ports, and measures with the peer (RunHostLinkPeer on the other host)
// the point-to-point and 2-rank AllReduce links as ProfileGlooLinks does (not the messages'
// CPU). Every wait for the peer ends within 60 s (DeadlineExceeded naming what it waited for).
struct HostLinkLeader {
  std::string address;
  int port = 0;
  std::function<void(int p2p_store_port, int replica_store_port)> on_listening;
};
absl::StatusOr<planner::HostLinks> ProfileHostLinks(const HostLinkLeader& leader);

// The other host's side: connects to the leader's stores and listens on `address` (this
// host's, reachable from the leader).
absl::Status RunHostLinkPeer(const std::string& leader_address, int p2p_store_port,
                             int replica_store_port, const std::string& address);

// How much longer the same computation takes on k threads at once, k = 1 .. cores: each
// thread multiplies 256 x 512 by 512 x 512 and applies GELU, 30 times (about the mix of a
// transformer block), one intra-op thread each, as ranks sharing this machine run.
std::vector<double> MeasureSlowdown(int cores);

}  // namespace pipetrain::profiler
