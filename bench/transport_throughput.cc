// transport_throughput: activation-transfer throughput of pipetrain's Gloo transport versus
// a raw loopback TCP stream of the same message sizes.
//
// Both sides run in this one process on two threads talking over 127.0.0.1:
//   gloo  two stages (0 and 1) of a 2-stage pipeline made by MakeGlooTransport, each with
//         its own client of a TCP store served here (as in tests/transport/
//         gloo_transport_test.cc). Stage 0 sends N float32 activations of the given byte
//         size with distinct, increasing micro-batch numbers (Transport::Send, then Flush);
//         stage 1 receives them in order (Transport::Recv). Each Gloo message is a small
//         header plus the payload; only payload bytes are counted.
//   raw   a plain POSIX socket pair (listen on port 0, connect, TCP_NODELAY on both ends);
//         the sender writes the same N messages of the same size (write all), the receiver
//         reads exactly that many bytes per message into a preallocated buffer.
// Each run first moves a few unmeasured warm-up messages, then times N messages from the
// first send to the last receive: throughput = N * size / that time, in MB/s (10^6 bytes).
// N is chosen per size from a short Gloo pilot run so that one measurement takes about
// --seconds. For each size the runs interleave (gloo, raw, gloo, raw, ... for --rounds
// rounds) so that machine noise hits both, and the best run of each side is reported.
// The connections (Gloo pair and socket pair) are made once and reused by every run.
//
// Run:  build-tp/bench/transport_throughput [--sizes 64,256,1024,4096,16384,65536]
//                                            [--seconds 0.5] [--rounds 2]
//       (--sizes in KiB). Prints a markdown table on stdout; the aim is gloo/raw >= 0.8.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/rendezvous/key_value_store.h"
#include "runtime/transport/gloo/gloo_transport.h"
#include "runtime/transport/transport.h"

namespace pipetrain::bench {
namespace {

constexpr int kWarmupMessages = 3;
constexpr int64_t kMinMessages = 5;
constexpr int64_t kMaxMessages = 200000;

struct Options {
  std::vector<int64_t> sizes_kib = {64, 256, 1024, 4096, 16384, 65536};
  double seconds = 0.5;  // per measurement
  int rounds = 2;
};

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--sizes KiB,KiB,...] [--seconds S] [--rounds N]\n"
               "  sizes are multiples of 4 bytes; default 64,256,1024,4096,16384,65536\n",
               argv0);
  std::exit(2);
}

int64_t PositiveInt(const std::string& text, int64_t max, const char* argv0) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || value < 1 || value > max) Usage(argv0);
  return value;
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) Usage(argv[0]);
    const std::string value = argv[++i];
    if (arg == "--sizes") {
      o.sizes_kib.clear();
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        o.sizes_kib.push_back(
            PositiveInt(value.substr(start, comma - start), 1 << 20, argv[0]));  // <= 1 GiB
        start = comma + 1;
      }
    } else if (arg == "--seconds") {
      char* end = nullptr;
      o.seconds = std::strtod(value.c_str(), &end);
      if (end == value.c_str() || *end != '\0' || !(o.seconds > 0) || o.seconds > 60) {
        Usage(argv[0]);
      }
    } else if (arg == "--rounds") {
      o.rounds = static_cast<int>(PositiveInt(value, 100, argv[0]));
    } else {
      Usage(argv[0]);
    }
  }
  return o;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "transport_throughput: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) Die(std::string(what) + ": " + std::string(value.status().message()));
  return *std::move(value);
}

void OrDie(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(std::string(what) + ": " + std::string(status.message()));
}

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// ---------------------------------------------------------------------------------------
// Gloo: two stages of one pipeline, each with its own store client, like two processes.

class GlooPair {
 public:
  GlooPair() {
    server_ = OrDie(rendezvous::ServeTcpStore("127.0.0.1", 0), "ServeTcpStore");
    const int port = rendezvous::TcpStorePort(*server_);
    auto make = [port](int stage) {
      std::shared_ptr<rendezvous::KeyValueStore> store = OrDie(
          rendezvous::ConnectTcpStore("127.0.0.1", port, absl::Seconds(20)), "ConnectTcpStore");
      transport::GlooTransportOptions o;
      o.stage = stage;
      o.stages = 2;
      o.connect_timeout = absl::Seconds(30);
      return OrDie(transport::MakeGlooTransport(std::move(store), o), "MakeGlooTransport");
    };
    auto other = std::async(std::launch::async, make, 1);
    stage0_ = make(0);
    stage1_ = other.get();
  }

  // Moves kWarmupMessages then `messages` activations of `payload` from stage 0 to stage 1;
  // returns the seconds from the first measured send to the last receive.
  double Run(const at::Tensor& payload, int64_t messages) {
    std::promise<void> warmed_up;
    std::future<void> warmed_up_future = warmed_up.get_future();
    const int64_t first = next_micro_batch_;
    next_micro_batch_ += kWarmupMessages + messages;
    Clock::time_point start, end;
    at::Tensor last;

    std::thread sender([&] {
      auto send = [&](int64_t micro_batch) {
        OrDie(stage0_->Send(1, transport::MessageKind::kActivation, micro_batch, payload), "Send");
      };
      for (int i = 0; i < kWarmupMessages; ++i) send(first + i);
      warmed_up_future.wait();
      start = Clock::now();
      for (int64_t i = 0; i < messages; ++i) send(first + kWarmupMessages + i);
      OrDie(stage0_->Flush(absl::Now() + absl::Seconds(120)), "Flush");
    });
    auto recv = [&](int64_t micro_batch) {
      return OrDie(stage1_->Recv(0, transport::MessageKind::kActivation, micro_batch,
                                 absl::Now() + absl::Seconds(120)),
                   "Recv");
    };
    for (int i = 0; i < kWarmupMessages; ++i) recv(first + i);
    warmed_up.set_value();
    for (int64_t i = 0; i < messages; ++i) last = recv(first + kWarmupMessages + i);
    end = Clock::now();
    sender.join();
    if (!last.defined() || !at::equal(last, payload)) Die("gloo: received data differ");
    return SecondsBetween(start, end);
  }

 private:
  std::unique_ptr<rendezvous::KeyValueStore> server_;  // outlives the transports
  std::unique_ptr<transport::Transport> stage0_, stage1_;
  int64_t next_micro_batch_ = 0;  // every message gets its own micro-batch number
};

// ---------------------------------------------------------------------------------------
// Raw TCP: one loopback socket pair, a byte stream with no framing.

void SetNoDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    Die(std::string("setsockopt(TCP_NODELAY): ") + std::strerror(errno));
  }
}

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Die(std::string("raw send: ") + std::strerror(errno));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void ReadExactly(int fd, char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::recv(fd, data, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Die(std::string("raw recv: ") + (n == 0 ? "peer closed" : std::strerror(errno)));
    data += n;
    size -= static_cast<size_t>(n);
  }
}

class RawTcpPair {
 public:
  RawTcpPair() {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) Die(std::string("socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      Die(std::string("listening on 127.0.0.1: ") + std::strerror(errno));
    }
    send_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (send_fd_ < 0 ||
        ::connect(send_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Die(std::string("connect: ") + std::strerror(errno));
    }
    recv_fd_ = ::accept(listener, nullptr, nullptr);
    if (recv_fd_ < 0) Die(std::string("accept: ") + std::strerror(errno));
    ::close(listener);
    SetNoDelay(send_fd_);
    SetNoDelay(recv_fd_);
  }
  ~RawTcpPair() {
    ::close(send_fd_);
    ::close(recv_fd_);
  }
  RawTcpPair(const RawTcpPair&) = delete;
  RawTcpPair& operator=(const RawTcpPair&) = delete;

  // Same protocol as GlooPair::Run, over the raw stream.
  double Run(const at::Tensor& payload, int64_t messages) {
    const char* data = static_cast<const char*>(payload.data_ptr());
    const size_t size = payload.nbytes();
    std::vector<char> buffer(size);  // preallocated (and touched) before timing
    std::promise<void> warmed_up;
    std::future<void> warmed_up_future = warmed_up.get_future();
    Clock::time_point start, end;

    std::thread sender([&] {
      for (int i = 0; i < kWarmupMessages; ++i) WriteAll(send_fd_, data, size);
      warmed_up_future.wait();
      start = Clock::now();
      for (int64_t i = 0; i < messages; ++i) WriteAll(send_fd_, data, size);
    });
    for (int i = 0; i < kWarmupMessages; ++i) ReadExactly(recv_fd_, buffer.data(), size);
    warmed_up.set_value();
    for (int64_t i = 0; i < messages; ++i) ReadExactly(recv_fd_, buffer.data(), size);
    end = Clock::now();
    sender.join();
    if (std::memcmp(buffer.data(), data, size) != 0) Die("raw: received data differ");
    return SecondsBetween(start, end);
  }

 private:
  int send_fd_ = -1, recv_fd_ = -1;
};

std::string SizeName(int64_t kib) {
  if (kib % 1024 == 0) return std::to_string(kib / 1024) + " MiB";
  return std::to_string(kib) + " KiB";
}

double MBps(int64_t bytes, int64_t messages, double seconds) {
  return static_cast<double>(bytes) * static_cast<double>(messages) / seconds / 1e6;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) {
  using namespace pipetrain::bench;
  const Options options = ParseOptions(argc, argv);
  for (int64_t kib : options.sizes_kib) {
    if ((kib * 1024) % 4 != 0) Usage(argv[0]);
  }
  GlooPair gloo;
  RawTcpPair raw;

  std::printf(
      "| size | gloo MB/s | raw TCP MB/s | ratio gloo/raw | messages per run | "
      "gloo runs MB/s | raw runs MB/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (int64_t kib : options.sizes_kib) {
    const int64_t bytes = kib * 1024;
    const at::Tensor payload = torch::rand({bytes / 4}, torch::kFloat);

    // Pilot: about 32 MiB (at least 4 messages) through Gloo to pick N for ~--seconds.
    const int64_t pilot = std::max<int64_t>(4, (int64_t{32} << 20) / bytes);
    const double pilot_s = gloo.Run(payload, pilot);
    const int64_t messages =
        std::clamp<int64_t>(static_cast<int64_t>(std::llround(options.seconds * pilot / pilot_s)),
                            kMinMessages, kMaxMessages);

    std::vector<double> gloo_mbps, raw_mbps;
    for (int round = 0; round < options.rounds; ++round) {
      gloo_mbps.push_back(MBps(bytes, messages, gloo.Run(payload, messages)));
      raw_mbps.push_back(MBps(bytes, messages, raw.Run(payload, messages)));
    }
    auto list = [](const std::vector<double>& v) {
      std::string out;
      for (double x : v) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%s%.0f", out.empty() ? "" : ", ", x);
        out += buf;
      }
      return out;
    };
    const double best_gloo = *std::max_element(gloo_mbps.begin(), gloo_mbps.end());
    const double best_raw = *std::max_element(raw_mbps.begin(), raw_mbps.end());
    std::printf("| %s | %.0f | %.0f | %.3f | %lld | %s | %s |\n", SizeName(kib).c_str(), best_gloo,
                best_raw, best_gloo / best_raw, static_cast<long long>(messages),
                list(gloo_mbps).c_str(), list(raw_mbps).c_str());
    std::fflush(stdout);
  }
  std::printf(
      "\nBest of %d interleaved runs per side (gloo, raw, gloo, raw, ...), each "
      "timing N messages from the first send to the last receive after %d warm-up "
      "messages; MB = 10^6 payload bytes (Gloo's per-message header not counted).\n",
      options.rounds, kWarmupMessages);
  return 0;
}
