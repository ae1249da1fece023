// The machine's part of a profile: the Gloo links between two ranks on loopback (both sides
// of the measurement, the peer process's included) and the slowdown of computing on several
// cores at once. See machine_profiling.h.
#include "runtime/profiler/machine_profiling.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <iterator>
#include <memory>
#include <string>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/subprocess.h"
#include "runtime/base/threads.h"
#include "runtime/profiler/profiler.h"
#include "runtime/profiler/timing.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/gloo/gloo_transport.h"

namespace pipetrain::profiler {
namespace {

// Fits latency + bytes / bandwidth through (small, t_small) and (large, t_large).
planner::LinkProfile Fit(double small, double t_small, double large, double t_large) {
  planner::LinkProfile link;
  const double slope = std::max((t_large - t_small) / (large - small), 1e-15);
  link.bytes_per_s = 1.0 / slope;
  link.latency_s = std::max(0.0, t_small - small * slope);
  return link;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// The link measurements, run by two sides in step: side 0 (the profiler) leads and keeps the
// results, side 1 (a process of its own, as ranks run, or a thread of this one) follows the
// same sequence and hands its CPU times to side 0 through the point-to-point store.
constexpr int kPingPongRounds = 20;
constexpr int64_t kSmallFloats = 256, kLargeFloats = 1 << 20;  // 1 KiB and 4 MiB
constexpr int kMessageRounds = 60;
// Message sizes whose CPU is measured: the largest carried inline (128 KiB) and one just
// above it (a second message) among them.
constexpr int64_t kMessageBytes[] = {256, 16 << 10, 128 << 10, 160 << 10, 1 << 20, 8 << 20};
const absl::Duration kLinkTimeout = absl::Seconds(60);
constexpr char kLoopback[] = "127.0.0.1";

struct LinkSideResult {  // side 0's
  double p2p_small = 0, p2p_large = 0, ar_small = 0, ar_large = 0;
  double ar_cpu_small = 0, ar_cpu_large = 0;  // per rank
  std::vector<planner::MessageCost> messages;
};

absl::StatusOr<std::unique_ptr<transport::Transport>> LinkTransport(
    std::shared_ptr<rendezvous::KeyValueStore> store, int side, bool replicas,
    const std::string& address) {
  transport::GlooTransportOptions o;
  o.host = address;
  o.stage = replicas ? 0 : side;
  o.stages = replicas ? 1 : 2;
  o.replica = replicas ? side : 0;
  o.replicas = replicas ? 2 : 1;
  o.connect_timeout = kLinkTimeout;
  return transport::MakeGlooTransport(std::move(store), o);
}

// One side of the sequence. `same_process`: both sides are threads of this process, so a
// process's CPU time counts both.
// `address`: where this side's transport listens for the other's. Without
// `with_message_costs` (both sides alike) the messages between busy ranks are not measured.
absl::Status RunLinkSide(int side, std::shared_ptr<rendezvous::KeyValueStore> p2p_store,
                         std::shared_ptr<rendezvous::KeyValueStore> replica_store,
                         bool same_process, LinkSideResult* out,
                         const std::string& address = kLoopback, bool with_message_costs = true) {
  using transport::MessageKind;
  const int peer = 1 - side;
  auto p2p = LinkTransport(p2p_store, side, false, address);
  if (!p2p.ok()) return p2p.status();
  transport::Transport& link = **p2p;
  int64_t tag = 0;
  const auto deadline = [] { return absl::Now() + kLinkTimeout; };

  // Point to point: side 0 sends an activation, side 1 answers with a gradient of the same
  // size; one way is half the round trip (the median).
  const auto ping_pong = [&](int64_t floats) -> absl::StatusOr<double> {
    const at::Tensor t = at::ones({floats});
    std::vector<double> times;
    for (int r = 0; r < kPingPongRounds + 2; ++r, ++tag) {
      if (side == 1) {
        absl::StatusOr<at::Tensor> got = link.Recv(0, MessageKind::kActivation, tag, deadline());
        if (!got.ok()) return got.status();
        PT_RETURN_IF_ERROR(link.Send(0, MessageKind::kGradient, tag, *got));
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      PT_RETURN_IF_ERROR(link.Send(1, MessageKind::kActivation, tag, t));
      absl::StatusOr<at::Tensor> back = link.Recv(1, MessageKind::kGradient, tag, deadline());
      if (!back.ok()) return back.status();
      if (r >= 2) times.push_back(Seconds(t0, std::chrono::steady_clock::now()) / 2);
    }
    return Median(times);
  };
  absl::StatusOr<double> p2p_small = ping_pong(kSmallFloats);
  if (!p2p_small.ok()) return p2p_small.status();
  absl::StatusOr<double> p2p_large = ping_pong(kLargeFloats);
  if (!p2p_large.ok()) return p2p_large.status();

  // Messages between busy ranks: each side repeats {compute for about half a millisecond;
  // send message r to the other; receive the other's message r}, as neighbouring stages do.
  // Per message: the sending thread's CPU in Send, the receiving thread's in Recv (its
  // waits cost none), and every other thread's of the process (the transport's event loop
  // and delivery thread, woken for each message): the medians of the sides' per-round means.
  const at::Tensor x = at::randn({128, 256}), weight = at::randn({256, 256});
  const auto compute = [&](int reps) {
    for (int i = 0; i < reps; ++i) at::mm(x, weight);
  };
  compute(4);
  const auto c0 = std::chrono::steady_clock::now();
  compute(20);
  const int reps = std::max(
      1,
      static_cast<int>(5e-4 / std::max(Seconds(c0, std::chrono::steady_clock::now()) / 20, 1e-7)));
  const size_t message_sizes = with_message_costs ? std::size(kMessageBytes) : 0;
  for (size_t i = 0; i < message_sizes; ++i) {
    const int64_t bytes = kMessageBytes[i];
    const at::Tensor t = at::ones({bytes / 4});
    // Per round: this side's CPU in Send and in Recv, the CPU of its process's other threads,
    // and how long its Recv lasted.
    std::vector<double> send, recv, others, waits;
    for (int r = 0; r < kMessageRounds + 2; ++r, ++tag) {
      compute(reps);
      const double process0 = ProcessCpuSeconds(), s0 = ThreadCpuSeconds();
      PT_RETURN_IF_ERROR(link.Send(peer, MessageKind::kActivation, tag, t));
      const double s1 = ThreadCpuSeconds();
      const auto sent = std::chrono::steady_clock::now();
      absl::StatusOr<at::Tensor> got = link.Recv(peer, MessageKind::kActivation, tag, deadline());
      if (!got.ok()) return got.status();
      const double s2 = ThreadCpuSeconds();
      if (r < 2) continue;
      waits.push_back(Seconds(sent, std::chrono::steady_clock::now()));
      send.push_back(s1 - s0);
      recv.push_back(s2 - s1);
      // Until the next round's exchange begins, the other threads' work for this one goes on.
      others.push_back(ProcessCpuSeconds() - process0 - (s2 - s0));
    }
    // The other threads' work outlasts the round it belongs to: their CPU over a whole round,
    // from one exchange to the next, is what one exchange costs them.
    std::vector<double> per_round;
    for (size_t k = 0; k + 1 < others.size(); ++k) per_round.push_back(others[k]);
    const std::string key = absl::StrCat("messages/", i);
    const std::string mine =
        absl::StrCat(Median(send), " ", Median(recv), " ", Median(per_round), " ", Median(waits));
    if (side == 1) {
      PT_RETURN_IF_ERROR(p2p_store->Set(key, mine));
      continue;
    }
    absl::StatusOr<std::string> theirs = p2p_store->Get(key, kLinkTimeout);
    if (!theirs.ok()) return theirs.status();
    double peer_send = 0, peer_recv = 0, peer_others = 0, peer_wait = 0;
    if (std::sscanf(theirs->c_str(), "%lf %lf %lf %lf", &peer_send, &peer_recv, &peer_others,
                    &peer_wait) != 4) {
      return absl::InternalError("the link peer's message report does not parse");
    }
    // Both sides send at about the same time, so a Recv lasts about the message's way. In
    // one process, each side's other threads are the other side's and the transports' both.
    const double background = same_process
                                  ? std::max(0.0, Median(per_round) - peer_send - peer_recv) / 2
                                  : (Median(per_round) + peer_others) / 2;
    out->messages.push_back({bytes, (Median(send) + peer_send) / 2, (Median(recv) + peer_recv) / 2,
                             std::max(0.0, background), (Median(waits) + peer_wait) / 2});
  }

  // AllReduce between the two: elapsed and the CPU of one rank (its process's; both ranks'
  // halved when they share this process), the medians over the rounds.
  auto reduce_link = LinkTransport(replica_store, side, true, address);
  if (!reduce_link.ok()) return reduce_link.status();
  const auto reduce = [&](int64_t floats, int which, double* cpu) -> absl::StatusOr<double> {
    std::vector<double> times, cpu_times;
    for (int r = 0; r < kPingPongRounds + 2; ++r) {
      std::vector<at::Tensor> v = {at::ones({floats})};
      const double process0 = ProcessCpuSeconds();
      const auto t0 = std::chrono::steady_clock::now();
      PT_RETURN_IF_ERROR((*reduce_link)->AllReduceMean(v, deadline()));
      if (r < 2) continue;
      times.push_back(Seconds(t0, std::chrono::steady_clock::now()));
      cpu_times.push_back(ProcessCpuSeconds() - process0);
    }
    const double mine = Median(cpu_times);
    const std::string key = absl::StrCat("allreduce/", which);
    if (side == 1) {
      PT_RETURN_IF_ERROR(p2p_store->Set(key, absl::StrCat(mine)));
    } else {
      absl::StatusOr<std::string> theirs = p2p_store->Get(key, kLinkTimeout);
      if (!theirs.ok()) return theirs.status();
      double peer_cpu = 0;
      if (!absl::SimpleAtod(*theirs, &peer_cpu)) {
        return absl::InternalError("the link peer's AllReduce report does not parse");
      }
      *cpu = same_process ? mine / 2 : (mine + peer_cpu) / 2;
    }
    return Median(times);
  };
  double cpu_small = 0, cpu_large = 0;
  absl::StatusOr<double> ar_small = reduce(kSmallFloats, 0, &cpu_small);
  if (!ar_small.ok()) return ar_small.status();
  absl::StatusOr<double> ar_large = reduce(kLargeFloats, 1, &cpu_large);
  if (!ar_large.ok()) return ar_large.status();
  if (side == 0) {
    out->p2p_small = *p2p_small;
    out->p2p_large = *p2p_large;
    out->ar_small = *ar_small;
    out->ar_large = *ar_large;
    out->ar_cpu_small = cpu_small;
    out->ar_cpu_large = cpu_large;
  }
  // Neither side leaves (closing its connections) before the other is done.
  PT_RETURN_IF_ERROR(p2p_store->Set(absl::StrCat("done/", side), "1"));
  return p2p_store->Get(absl::StrCat("done/", peer), kLinkTimeout).status();
}

// The links fitted to both sides' measurements.
GlooLinks LinksOf(const LinkSideResult& result) {
  const double small = 4.0 * kSmallFloats, large = 4.0 * kLargeFloats;
  GlooLinks links;
  links.p2p = Fit(small, result.p2p_small, large, result.p2p_large);
  // A 2-rank ring AllReduce takes 2 latencies + bytes / bandwidth (profile.h).
  links.allreduce = Fit(small, result.ar_small, large, result.ar_large);
  links.allreduce.latency_s /= 2;
  links.allreduce_cpu = Fit(small, result.ar_cpu_small, large, result.ar_cpu_large);
  links.messages = result.messages;
  return links;
}

}  // namespace

std::vector<double> MeasureSlowdown(int cores) {
  const auto work = [] {
    const at::Tensor x = at::randn({256, 512}), w = at::randn({512, 512});
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 30; ++i) at::gelu(at::mm(x, w)).add_(1.0);
    return Seconds(t0, std::chrono::steady_clock::now());
  };
  const auto together = [&](int k) {
    std::vector<double> times;
    for (int round = 0; round < 3; ++round) {
      std::vector<std::future<double>> runs;
      for (int t = 0; t < k; ++t) runs.push_back(std::async(std::launch::async, work));
      double sum = 0;
      for (auto& r : runs) sum += r.get();
      times.push_back(sum / k);
    }
    return Median(times);
  };
  work();  // warm-up
  const double alone = together(1);
  std::vector<double> slowdown = {1.0};
  for (int k = 2; k <= cores; ++k) slowdown.push_back(std::max(1.0, together(k) / alone));
  return slowdown;
}

absl::StatusOr<GlooLinks> ProfileGlooLinks(const std::vector<std::string>& peer_command) {
  LinkSideResult result;
  if (peer_command.empty()) {
    std::shared_ptr<rendezvous::KeyValueStore> p2p_store = rendezvous::MakeMemoryStore();
    std::shared_ptr<rendezvous::KeyValueStore> replica_store = rendezvous::MakeMemoryStore();
    auto other = std::async(std::launch::async, [&] {
      return RunLinkSide(1, p2p_store, replica_store, true, nullptr);
    });
    absl::Status mine = RunLinkSide(0, p2p_store, replica_store, true, &result);
    if (!mine.ok()) p2p_store->Set("done/0", "1").IgnoreError();  // lets the other side end
    absl::Status theirs = other.get();
    PT_RETURN_IF_ERROR(mine);
    PT_RETURN_IF_ERROR(theirs);
  } else {
    PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> p2p_store,
                        rendezvous::ServeTcpStore(kLoopback, 0));
    PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> replica_store,
                        rendezvous::ServeTcpStore(kLoopback, 0));
    std::vector<std::string> args = peer_command;
    args.push_back(absl::StrCat(rendezvous::TcpStorePort(*p2p_store)));
    args.push_back(absl::StrCat(rendezvous::TcpStorePort(*replica_store)));
    subprocess::Options spawn;
    spawn.stdin_null = false;
    absl::StatusOr<pid_t> pid = subprocess::Start(args, spawn);
    if (!pid.ok()) {
      return absl::InternalError(
          absl::StrCat("cannot start the link peer ", args[0], ": ", pid.status().message()));
    }
    absl::Status mine =
        RunLinkSide(0, std::move(p2p_store), std::move(replica_store), false, &result);
    if (!mine.ok()) kill(*pid, SIGKILL);
    const int status = subprocess::Wait(*pid);
    PT_RETURN_IF_ERROR(mine);
    if (status < 0 || subprocess::ExitCode(status) != 0) {
      return absl::InternalError(absl::StrCat(
          "the link peer process ", status < 0 ? "was lost" : subprocess::DescribeExit(status)));
    }
  }
  return LinksOf(result);
}

absl::StatusOr<planner::HostLinks> ProfileHostLinks(const HostLinkLeader& leader) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> p2p_store,
                      rendezvous::ServeTcpStore(leader.address, leader.port));
  PT_ASSIGN_OR_RETURN(
      std::unique_ptr<rendezvous::KeyValueStore> replica_store,
      rendezvous::ServeTcpStore(leader.address, leader.port > 0 ? leader.port + 1 : 0));
  if (leader.on_listening) {
    leader.on_listening(rendezvous::TcpStorePort(*p2p_store),
                        rendezvous::TcpStorePort(*replica_store));
  }
  LinkSideResult result;
  PT_RETURN_IF_ERROR(RunLinkSide(0, std::move(p2p_store), std::move(replica_store), false, &result,
                                 leader.address, /*with_message_costs=*/false));
  const GlooLinks links = LinksOf(result);
  planner::HostLinks out;
  out.p2p = links.p2p;
  out.allreduce = links.allreduce;
  return out;
}

absl::Status RunHostLinkPeer(const std::string& leader_address, int p2p_store_port,
                             int replica_store_port, const std::string& address) {
  SetIntraOpThreads(1);
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> p2p_store,
                      rendezvous::ConnectTcpStore(leader_address, p2p_store_port, kLinkTimeout));
  PT_ASSIGN_OR_RETURN(
      std::unique_ptr<rendezvous::KeyValueStore> replica_store,
      rendezvous::ConnectTcpStore(leader_address, replica_store_port, kLinkTimeout));
  return RunLinkSide(1, std::move(p2p_store), std::move(replica_store), false, nullptr, address,
                     /*with_message_costs=*/false);
}

absl::Status RunLinkPeer(int p2p_store_port, int replica_store_port) {
  SetIntraOpThreads(1);
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> p2p_store,
                      rendezvous::ConnectTcpStore(kLoopback, p2p_store_port, kLinkTimeout));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::KeyValueStore> replica_store,
                      rendezvous::ConnectTcpStore(kLoopback, replica_store_port, kLinkTimeout));
  return RunLinkSide(1, std::move(p2p_store), std::move(replica_store), false, nullptr);
}

}  // namespace pipetrain::profiler
