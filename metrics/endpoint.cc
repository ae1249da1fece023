#include "metrics/endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "metrics/http_messages.h"
#include "runtime/base/host_port.h"

namespace pipetrain::metrics {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The process's scrape schedule: the time the next scrape may start. Shared by every
// endpoint of the process (a daemon has one), since the bound is on the process's work.
std::mutex schedule_mu;
Clock::time_point next_scrape_start;

// Takes the next scrape slot of the process and returns its time (now, if none is taken).
Clock::time_point ReserveScrapeTurn() {
  std::lock_guard<std::mutex> lock(schedule_mu);
  const Clock::time_point turn = std::max(Clock::now(), next_scrape_start);
  next_scrape_start = turn + milliseconds(MetricsEndpoint::kScrapeSpacingMs);
  return turn;
}

std::string ErrnoText(int error) { return std::strerror(error); }

}  // namespace

// The event loop (one thread: accepts, reads request heads, writes responses, enforces every
// deadline and bound) and the rendering thread (takes complete scrape requests in turn,
// waits for the process's scrape slot, renders and hands the response back to the loop
// through `done_` and the eventfd).
class MetricsEndpoint::Server {
 public:
  Server(int listen_fd, int epoll_fd, int wake_fd, const Registry* registry)
      : listen_fd_(listen_fd), epoll_fd_(epoll_fd), wake_fd_(wake_fd), registry_(registry) {}

  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    stop_loop_ = true;
    Wake();  // the loop checks stop_loop_ after every wait: it is written first
    if (renderer_.joinable()) renderer_.join();
    if (loop_.joinable()) loop_.join();
    for (const auto& [id, conn] : conns_) close(conn.fd);
    close(wake_fd_);
    close(epoll_fd_);
    close(listen_fd_);
  }

  // Starts both threads; false (with `error` set) if either cannot be made.
  bool Run(std::string* error) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerId;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) {
      *error = absl::StrCat("epoll_ctl: ", ErrnoText(errno));
      return false;
    }
    ev.data.u64 = kWakeId;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
      *error = absl::StrCat("epoll_ctl: ", ErrnoText(errno));
      return false;
    }
    try {
      loop_ = std::thread([this] { Loop(); });
      renderer_ = std::thread([this] { ServeScrapes(); });
    } catch (const std::exception& e) {
      *error = absl::StrCat("cannot start its threads: ", e.what());
      return false;  // the destructor stops and joins whichever started
    }
    pthread_setname_np(loop_.native_handle(), "metrics-http");
    pthread_setname_np(renderer_.native_handle(), "metrics-render");
    return true;
  }

 private:
  static constexpr uint64_t kListenerId = 0, kWakeId = 1;
  // After accept fails for want of descriptors, accepting waits this long (the loop would
  // otherwise spin on a listener that stays readable).
  static constexpr int kAcceptPauseMs = 100;
  static constexpr int kAcceptsPerRound = 256;
  static constexpr size_t kMaxHead = kMaxRequestBytes;

  enum class State {
    kReading,  // the request head is not complete yet
    kQueued,   // a scrape waiting in line or being rendered
    kWriting,  // its response is being written
  };
  struct Connection {
    int fd = -1;
    State state = State::kReading;
    Clock::time_point deadline;  // reading: of the head (from its accept); writing: of the response
    std::string in;              // at most kMaxRequestBytes
    std::string out;
    size_t written = 0;
  };
  struct Rendered {
    uint64_t id;
    std::string response;
  };

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  void Watch(uint64_t id, const Connection& conn, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, conn.fd, &ev);
  }

  void Close(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    if (it->second.state == State::kQueued) {
      // Out of the line, so that no scrape is rendered for it (if it is being rendered, the
      // response is dropped when it comes back).
      std::lock_guard<std::mutex> lock(mu_);
      auto queued =
          std::find_if(queue_.begin(), queue_.end(), [&](const auto& q) { return q.first == id; });
      if (queued != queue_.end()) queue_.erase(queued);
    }
    close(it->second.fd);  // also removes it from the epoll set
    conns_.erase(it);
  }

  // Starts writing `response` on `id`, which is then closed once it is written (or when
  // kWriteTimeoutMs have passed).
  void Respond(uint64_t id, std::string response) {
    Connection& conn = conns_.at(id);
    conn.state = State::kWriting;
    conn.out = std::move(response);
    conn.written = 0;
    conn.in = std::string();  // its buffer is not needed any more
    conn.deadline = Clock::now() + milliseconds(kWriteTimeoutMs);
    OnWritable(id);
  }

  void OnWritable(uint64_t id) {
    Connection& conn = conns_.at(id);
    while (conn.written < conn.out.size()) {
      const ssize_t n = send(conn.fd, conn.out.data() + conn.written,
                             conn.out.size() - conn.written, MSG_NOSIGNAL);
      if (n > 0) {
        conn.written += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        Watch(id, conn, EPOLLOUT);
        return;
      } else {
        break;  // the peer is gone
      }
    }
    Close(id);  // written whole (no keep-alive), or the peer is gone
  }

  void OnReadable(uint64_t id) {
    Connection& conn = conns_.at(id);
    char buf[4096];
    size_t head_end = std::string::npos;
    while (head_end == std::string::npos && conn.in.size() < kMaxHead) {
      const size_t room = std::min(sizeof(buf), kMaxHead - conn.in.size());
      const ssize_t n = recv(conn.fd, buf, room, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // more later
      if (n <= 0) {
        Close(id);  // closed (or reset) before its request was complete
        return;
      }
      const size_t scanned = conn.in.size();
      conn.in.append(buf, static_cast<size_t>(n));
      head_end = http::HeadEnd(conn.in, scanned > 2 ? scanned - 2 : 0);
    }
    if (head_end == std::string::npos) {
      // kMaxRequestBytes without the end of the head: refused; the rest is never read.
      Respond(id, http::TextResponse(431, "Request Header Fields Too Large",
                                     absl::StrCat("the request line and headers are limited to ",
                                                  kMaxRequestBytes, " bytes\n")));
      return;
    }
    http::Verdict verdict = http::JudgeRequest(absl::string_view(conn.in).substr(0, head_end));
    if (verdict.status != 0) {
      Respond(id, std::move(verdict.response));
      return;
    }
    conn.state = State::kQueued;
    conn.in = std::string();
    Watch(id, conn, 0);  // nothing more is read from it; errors are still reported
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(id, verdict.gzip);
    }
    cv_.notify_one();
  }

  // The connection that has waited longest without a complete request (0 if none): ids
  // grow in the order of accept.
  uint64_t OldestReading() const {
    uint64_t oldest = 0;
    for (const auto& [id, conn] : conns_) {
      if (conn.state == State::kReading && (oldest == 0 || id < oldest)) oldest = id;
    }
    return oldest;
  }

  // Below kMaxConnections by closing the connections that have waited longest without a
  // complete request; false if every connection has one. Each is read once more first: in a
  // flood, a request may have arrived since the loop last looked (it then stays).
  bool MakeRoom() {
    while (conns_.size() >= static_cast<size_t>(kMaxConnections)) {
      const uint64_t oldest = OldestReading();
      if (oldest == 0) return false;
      OnReadable(oldest);
      auto it = conns_.find(oldest);
      if (it != conns_.end() && it->second.state == State::kReading) Close(oldest);
    }
    return true;
  }

  void AcceptAll() {
    // At most kAcceptsPerRound at a time, so that a flood of connections does not keep the
    // loop from the requests of those it accepted (the listener stays readable: the rest are
    // taken next round).
    for (int accepted = 0; accepted < kAcceptsPerRound; ++accepted) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // Out of descriptors (or memory): the process's other work comes first; connections
          // wait in the backlog meanwhile.
          accept_paused_until_ = Clock::now() + milliseconds(kAcceptPauseMs);
          epoll_event ev{};
          ev.data.u64 = kListenerId;
          epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
        }
        return;  // EAGAIN: all accepted
      }
      if (!MakeRoom()) {
        // Every connection has a request in line or a response being written: this one is
        // refused at once (a fresh socket's buffer takes the few bytes).
        const std::string busy =
            http::TextResponse(503, "Service Unavailable", "too many connections; retry later\n",
                               "Retry-After: 1\r\n");
        (void)!send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
        close(fd);
        continue;
      }
      const uint64_t id = next_id_++;
      Connection& conn = conns_[id];
      conn.fd = fd;
      conn.deadline = Clock::now() + milliseconds(kRequestTimeoutMs);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
        Close(id);
        continue;
      }
      OnReadable(id);  // its request has often arrived with the handshake already
    }
  }

  // Takes the rendered responses from the rendering thread and starts writing them.
  void TakeRendered() {
    uint64_t count;
    (void)!read(wake_fd_, &count, sizeof(count));
    std::vector<Rendered> rendered;
    {
      std::lock_guard<std::mutex> lock(mu_);
      rendered.swap(done_);
    }
    for (Rendered& r : rendered) {
      auto it = conns_.find(r.id);
      if (it == conns_.end()) continue;  // closed meanwhile
      Respond(r.id, std::move(r.response));
    }
  }

  // Closes every connection past its deadline; returns the time until the next deadline
  // (for epoll_wait: -1 for none).
  int ExpireAndTimeout() {
    const Clock::time_point now = Clock::now();
    std::vector<uint64_t> expired;
    Clock::time_point next = Clock::time_point::max();
    for (const auto& [id, conn] : conns_) {
      if (conn.state == State::kQueued) continue;  // the line is bounded, not timed
      if (conn.deadline <= now) {
        expired.push_back(id);
      } else {
        next = std::min(next, conn.deadline);
      }
    }
    for (const uint64_t id : expired) Close(id);
    if (accept_paused_until_ != Clock::time_point()) {
      if (accept_paused_until_ <= now) {
        accept_paused_until_ = Clock::time_point();
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenerId;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      } else {
        next = std::min(next, accept_paused_until_);
      }
    }
    if (next == Clock::time_point::max()) return -1;
    // Rounded up, so that the loop does not wake just before a deadline and spin.
    return static_cast<int>(std::chrono::ceil<milliseconds>(next - now).count());
  }

  void Loop() {
    epoll_event events[64];
    while (!stop_loop_.load()) {
      const int timeout = ExpireAndTimeout();
      const int n = epoll_wait(epoll_fd_, events, 64, timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        break;  // cannot happen with a valid epoll descriptor
      }
      if (stop_loop_.load()) break;
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kListenerId) {
          AcceptAll();
          continue;
        }
        if (id == kWakeId) {
          TakeRendered();
          continue;
        }
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;  // closed earlier in this round
        const uint32_t what = events[i].events;
        switch (it->second.state) {
          case State::kReading:
            if (what & (EPOLLIN | EPOLLERR | EPOLLHUP)) OnReadable(id);
            break;
          case State::kQueued:
            if (what & (EPOLLERR | EPOLLHUP)) Close(id);  // reset: no scrape for it
            break;
          case State::kWriting:
            if (what & (EPOLLOUT | EPOLLERR | EPOLLHUP)) OnWritable(id);
            break;
        }
      }
    }
    // Stopping: every connection is closed here, on the loop's thread (its own state).
    while (!conns_.empty()) Close(conns_.begin()->first);
  }

  // The rendering thread: one scrape at a time, each in the process's next scrape slot.
  void ServeScrapes() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      const Clock::time_point turn = ReserveScrapeTurn();
      if (cv_.wait_until(lock, turn, [&] { return stopping_; })) return;
      if (queue_.empty()) continue;  // its connection went while it waited (the slot unused)
      const auto [id, gzip] = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::string response;
      try {
        const std::string text = registry_->Render();
        std::string compressed;
        if (gzip && http::Gzip(text, &compressed)) {
          response =
              http::Response(200, "OK", kContentType, compressed, "Content-Encoding: gzip\r\n");
        } else {
          response = http::Response(200, "OK", kContentType, text);
        }
      } catch (const std::exception& e) {
        response = http::TextResponse(500, "Internal Server Error",
                                      absl::StrCat("cannot render the metrics: ", e.what(), "\n"));
      }
      lock.lock();
      done_.push_back({id, std::move(response)});
      Wake();
    }
  }

  static constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

  const int listen_fd_, epoll_fd_, wake_fd_;
  const Registry* const registry_;
  std::thread loop_, renderer_;

  // The loop's own state (only its thread touches it, then the destructor after the join).
  std::unordered_map<uint64_t, Connection> conns_;
  uint64_t next_id_ = 2;  // after kListenerId and kWakeId
  Clock::time_point accept_paused_until_;
  std::atomic<bool> stop_loop_{false};

  // Shared by the loop and the rendering thread.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<std::pair<uint64_t, bool>> queue_;  // scrapes in line: connection, gzip
  std::vector<Rendered> done_;                   // rendered, for the loop to write
};

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Server> server, std::string address)
    : server_(std::move(server)), address_(std::move(address)) {}

MetricsEndpoint::~MetricsEndpoint() = default;

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host_port, const Registry* registry) {
  const absl::StatusOr<HostPort> address = ParseHostPort(host_port);
  if (!address.ok() || address->host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: expected HOST:PORT (port 0: any free one), got '", host_port, "'"));
  }
  const std::string& host = address->host;
  const int port = address->port;
  const bool bracketed = host_port.front() == '[';
  const bool ipv6 = host.find(':') != std::string::npos;
  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  bool parsed = false;
  if (ipv6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    parsed = inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) == 1;
    addr_len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    parsed = inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1;
    addr_len = sizeof(sockaddr_in);
  }
  if (!parsed || bracketed == !ipv6) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: expected HOST:PORT with an IP address as host ([::1] for IPv6), "
        "got '",
        host_port, "'"));
  }
  const std::string shown_host = ipv6 ? "[" + host + "]" : host;
  const auto cannot_listen = [&](const char* what, int error) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", host_port,
                                               ": cannot listen there (", what, ": ",
                                               ErrnoText(error), "; is the port in use?)"));
  };

  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return cannot_listen("socket", errno);
  // SO_REUSEADDR only lets a restarted daemon bind past its predecessor's TIME_WAIT
  // connections; without SO_REUSEPORT a port another socket listens on stays refused.
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (ipv6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
  // A full backlog would drop new handshakes (the client retries a second later); the loop
  // empties it as fast as connections come, so a large one costs nothing.
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), addr_len) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    const int error = errno;
    close(fd);
    return cannot_listen("bind", error);
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len) != 0) {
    const int error = errno;
    close(fd);
    return cannot_listen("getsockname", error);
  }
  const int bound_port = ntohs(ipv6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                    : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd < 0 || wake_fd < 0) {
    const int error = errno;
    if (epoll_fd >= 0) close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("--metrics-listen ", host_port, ": ", ErrnoText(error)));
  }
  std::unique_ptr<Server> server;
  try {
    server = std::make_unique<Server>(fd, epoll_fd, wake_fd, registry);
  } catch (const std::exception& e) {
    close(wake_fd);
    close(epoll_fd);
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("--metrics-listen ", host_port, ": ", e.what()));
  }
  std::string error;
  if (!server->Run(&error)) {
    return absl::ResourceExhaustedError(absl::StrCat("--metrics-listen ", host_port, ": ", error));
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(server), absl::StrCat(shown_host, ":", bound_port)));
}

}  // namespace pipetrain::metrics
