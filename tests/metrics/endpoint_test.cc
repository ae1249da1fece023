// The /metrics endpoint (metrics/endpoint.h) against what a hostile or careless client sends:
// only GET /metrics, no body read, bounded headers, slow clients cut off, gzip, a flood of
// idle connections holding few descriptors and never keeping a scrape waiting (and the same
// flood against a thread-per-connection server in miniature, which it does keep waiting: the
// check can fail), scrape work spaced, a port in use refused at start, a prompt stop.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "metrics/endpoint.h"
#include "metrics/metrics.h"
#include "runtime/base/host_port.h"
#include "tests/metrics/promtool.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;

// --- The endpoint (metrics/endpoint.h), spoken to over raw sockets as a hostile client would.

int PortOf(const std::string& address) { return ParseHostPort(address).value().port; }

// A connected TCP socket to 127.0.0.1:`port` (-1 on failure), with 10 s send/receive timeouts.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Everything the server sends until it closes (or 10 s pass).
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// One request, the whole response; "" if the connection failed.
std::string Request(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  SendAll(fd, request);
  std::string response = ReadAll(fd);
  close(fd);
  return response;
}

int StatusOf(const std::string& response) {
  return response.size() > 12 ? std::atoi(response.c_str() + 9) : -1;  // "HTTP/1.1 200"
}

int64_t OwnResidentBytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

int OpenDescriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

class MetricsEndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.GetGauge("pipetrain_up", "Serving.", {}, {}).Set(1);
    auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", &registry_);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status();
    endpoint_ = *std::move(endpoint);
    port_ = PortOf(endpoint_->address());
  }
  std::string Scrape() { return Request(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); }

  Registry registry_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
  int port_ = 0;
};

TEST_F(MetricsEndpointTest, ServesMetricsAnswers404ElsewhereAndRefusesAPortInUse) {
  httplib::Client client("127.0.0.1", port_);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->get_header_value("Content-Type"), HasSubstr("text/plain"));
  EXPECT_THAT(metrics->body, HasSubstr("pipetrain_up 1\n"));
  auto other = client.Get("/metric");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_THAT(other->body, HasSubstr("metrics are at /metrics"));
  auto second = MetricsEndpoint::Start(endpoint_->address(), &registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("--metrics-listen " + endpoint_->address() + ": cannot listen there ("));
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("is the port in use?"));
  EXPECT_FALSE(MetricsEndpoint::Start("nonsense", &registry_).ok());
  EXPECT_FALSE(MetricsEndpoint::Start("127.0.0.1:70000", &registry_).ok());
  EXPECT_FALSE(MetricsEndpoint::Start("::1:0", &registry_).ok());        // IPv6 needs brackets
  EXPECT_FALSE(MetricsEndpoint::Start("localhost:0", &registry_).ok());  // an IP address
  // IPv6, where this host has a loopback address for it.
  const int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 loopback6{};
  loopback6.sin6_family = AF_INET6;
  loopback6.sin6_addr = in6addr_loopback;
  const bool has_ipv6 =
      probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&loopback6), sizeof(loopback6)) == 0;
  if (probe >= 0) close(probe);
  auto v6 = MetricsEndpoint::Start("[::1]:0", &registry_);
  if (has_ipv6) {
    ASSERT_TRUE(v6.ok()) << v6.status();
    EXPECT_THAT((*v6)->address(), ::testing::StartsWith("[::1]:"));
    EXPECT_NE(PortOf((*v6)->address()), 0);
    httplib::Client client6("::1", PortOf((*v6)->address()));
    auto res = client6.Get("/metrics");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  } else {
    std::fprintf(stderr, "no IPv6 loopback here: [::1]:0 not served (%s)\n",
                 v6.ok() ? "started" : std::string(v6.status().message()).c_str());
  }
}

// A scraper that accepts gzip gets the same text gzip-compressed (Content-Encoding: gzip, the
// gzip magic, Content-Length that of the compressed body); one that does not, or refuses it
// (q=0), gets it as it is. 200 responses carry the exposition format's content type.
TEST_F(MetricsEndpointTest, ServesGzipToScrapersThatAcceptIt) {
  for (int i = 0; i < 200; ++i) {
    registry_.GetGauge("pipetrain_padding", "Padding.", {"i"}, {std::to_string(i)}).Set(i);
  }
  const std::string plain = registry_.Render();
  // The response's head and body, split at the empty line.
  const auto split = [](const std::string& response) {
    const size_t end = response.find("\r\n\r\n");
    return end == std::string::npos ? std::pair<std::string, std::string>{response, ""}
                                    : std::pair<std::string, std::string>{
                                          response.substr(0, end + 2), response.substr(end + 4)};
  };
  {
    const auto [head, body] = split(Request(port_,
                                            "GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n"
                                            "Accept-Encoding: deflate, GZIP;q=0.5\r\n\r\n"));
    EXPECT_EQ(StatusOf(head), 200) << head;
    EXPECT_THAT(head, HasSubstr("Content-Encoding: gzip\r\n"));
    EXPECT_THAT(head, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
    EXPECT_THAT(head, HasSubstr("Content-Length: " + std::to_string(body.size()) + "\r\n"));
    EXPECT_THAT(head, HasSubstr("Connection: close\r\n"));
    ASSERT_GE(body.size(), 18u);
    EXPECT_EQ(body.substr(0, 2), "\x1f\x8b");
    EXPECT_LT(body.size(), plain.size() / 2);
  }
  for (const char* refused : {"", "Accept-Encoding: gzip;q=0\r\n", "Accept-Encoding: br\r\n"}) {
    const auto [head, body] = split(
        Request(port_, std::string("GET /metrics HTTP/1.1\r\nHost: x\r\n") + refused + "\r\n"));
    EXPECT_EQ(StatusOf(head), 200) << head;
    EXPECT_THAT(head, ::testing::Not(HasSubstr("Content-Encoding")));
    EXPECT_THAT(head, HasSubstr("Content-Length: " + std::to_string(body.size()) + "\r\n"));
    EXPECT_EQ(body, plain) << refused;
  }
  // cpp-httplib asks for gzip and inflates it: the text is the registry's.
  httplib::Client client("127.0.0.1", port_);
  auto res = client.Get("/metrics", {{"Accept-Encoding", "gzip"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Encoding"), "gzip");
  EXPECT_EQ(res->body, plain);
  const auto [status, out] = Promtool(res->body);
  EXPECT_EQ(status, 0) << out;
}

// A 404 shows the path it did not find truncated to 200 bytes, a client's control characters
// (and bytes that are not UTF-8) escaped as every text from elsewhere is (Printable), never
// raw.
TEST_F(MetricsEndpointTest, A404ShowsThePathTruncatedAndEscaped) {
  const std::string hostile =
      "GET /\x1b[2J\x07"
      "bell\x7f" +
      std::string(1000, 'p') + " HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string response = Request(port_, hostile);
  EXPECT_EQ(StatusOf(response), 404) << response;
  const std::string body = response.substr(response.find("\r\n\r\n") + 4);
  EXPECT_THAT(body, HasSubstr("no such path: /\\x1b[2J\\x07bell\\x7fppp"));
  EXPECT_THAT(body, HasSubstr("(metrics are at /metrics)"));
  for (const char c : body) {
    EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "raw byte " << static_cast<int>(c);
  }
  EXPECT_LT(body.size(), 200u + 3 * 4 + 64) << body;  // 200 bytes of path, 3 escaped
}

// Only GET /metrics; no request body is ever read: a POST announcing 1.5 GiB is answered 413
// and cut off after what the kernel's buffers take (a few MiB of the 64 it tries to send), a
// GET announcing a body too, and this process (the daemon) does not grow.
TEST_F(MetricsEndpointTest, AnswersOnlyGetAndNeverReadsABody) {
  const int64_t rss_before = OwnResidentBytes();
  const std::string post = Request(port_, "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(StatusOf(post), 405) << post;
  EXPECT_THAT(post, HasSubstr("Allow: GET"));
  EXPECT_EQ(StatusOf(Request(port_, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")), 405);
  EXPECT_EQ(StatusOf(Request(port_, "PUT /other HTTP/1.1\r\nHost: x\r\n\r\n")), 404);
  const std::string with_body =
      Request(port_, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 536870912\r\n\r\n");
  EXPECT_EQ(StatusOf(with_body), 413) << with_body;
  EXPECT_EQ(StatusOf(Request(port_,
                             "GET /metrics HTTP/1.1\r\nHost: x\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n")),
            413);
  {
    const int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(
        SendAll(fd, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1610612736\r\n\r\n"));
    const std::string chunk(1 << 20, 'x');
    int sent_mib = 0;
    for (; sent_mib < 64 && SendAll(fd, chunk); ++sent_mib) {
    }
    const std::string response = ReadAll(fd);
    close(fd);
    EXPECT_TRUE(response.empty() || StatusOf(response) == 413) << response.substr(0, 200);
    std::fprintf(stderr, "sent %d MiB of the body before the server closed\n", sent_mib);
    EXPECT_LT(sent_mib, 32) << "the server read the body";
  }
  EXPECT_LT(OwnResidentBytes() - rss_before, 16 << 20);
  EXPECT_EQ(StatusOf(Scrape()), 200);
}

// The request line and headers are bounded: a 64 MiB header line or 100,000 headers are
// refused (413 or a closed connection) without the process growing.
TEST_F(MetricsEndpointTest, OversizedHeadersAreRefused) {
  const int64_t rss_before = OwnResidentBytes();
  for (const std::string& headers :
       {std::string("X-Long: ") + std::string(64 << 20, 'a') + "\r\n", [] {
          std::string many;
          for (int i = 0; i < 100000; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
          return many;
        }()}) {
    const int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n");
    const std::string response = ReadAll(fd);
    close(fd);
    EXPECT_NE(StatusOf(response), 200) << response.substr(0, 200);
  }
  EXPECT_LT(OwnResidentBytes() - rss_before, 16 << 20);
  EXPECT_EQ(StatusOf(Scrape()), 200);
}

// Clients dribbling their headers (a byte every 500 ms) on more connections than the endpoint
// keeps are cut off (the oldest at once, the rest after the request timeout), and a scrape
// among them is answered.
TEST_F(MetricsEndpointTest, SlowHeadersAreCutOffAndScrapesGoOn) {
  std::vector<int> slow;
  for (int i = 0; i < MetricsEndpoint::kMaxConnections + 2; ++i) {
    const int fd = Connect(port_);
    ASSERT_GE(fd, 0);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> cut{0};
  std::thread dribbler([&] {
    const std::string request =
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(200, 'a') + "\r\n\r\n";
    std::vector<bool> open(slow.size(), true);
    for (size_t byte = 0; byte < request.size() && !stop; ++byte) {
      for (size_t i = 0; i < slow.size(); ++i) {
        if (open[i] && send(slow[i], &request[byte], 1, MSG_NOSIGNAL) != 1) {
          open[i] = false;
          ++cut;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  const std::string scrape = Scrape();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(StatusOf(scrape), 200);
  EXPECT_LT(seconds, MetricsEndpoint::kRequestTimeoutMs / 1000.0 + 3) << "the scrape waited";
  // Every dribbler is cut off by the server (its sends fail once it closed; a closed peer
  // makes the second send after the close fail).
  std::this_thread::sleep_for(std::chrono::milliseconds(MetricsEndpoint::kRequestTimeoutMs + 2500));
  stop = true;
  dribbler.join();
  for (int fd : slow) close(fd);
  EXPECT_EQ(cut.load(), static_cast<int>(slow.size()));
}

// --- A flood of idle connections: 1000 opened at once and kept open, and a new one every
// 2 ms while 7 scrapes from new connections must each be answered within 1.5 s.

constexpr int kIdleAtOnce = 1000;
constexpr int kFloodScrapes = 7;
constexpr double kScrapeDeadlineSeconds = 1.5;

// Raises this process's soft descriptor limit to `wanted`, and its hard limit too where it
// is lower and the process may (root, as CI runs); false if it stays below.
bool RaiseDescriptorLimit(rlim_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  if (limit.rlim_cur >= wanted) return true;
  if (limit.rlim_max < wanted) {
    rlimit raised{wanted, wanted};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return true;
  }
  limit.rlim_cur = std::min(wanted, limit.rlim_max);
  return setrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur >= wanted;
}

// A connection to 127.0.0.1:`port` that never sends a byte (its handshake may still be in
// progress when this returns); -1 if no socket could be made.
int ConnectIdle(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS is fine
  return fd;
}

// kIdleAtOnce idle connections, opened at once on construction and kept open until the
// flood is destroyed; StartChurn() adds a new idle connection every 2 ms from a thread of its
// own (keeping its latest kIdleAtOnce open), until destruction.
class IdleFlood {
 public:
  explicit IdleFlood(int port) : port_(port) {
    for (int i = 0; i < kIdleAtOnce; ++i) {
      const int fd = ConnectIdle(port);
      if (fd >= 0) at_once_.push_back(fd);
    }
  }
  ~IdleFlood() {
    stop_ = true;
    if (churn_.joinable()) churn_.join();
    for (int fd : at_once_) close(fd);
  }
  void StartChurn() {
    churn_ = std::thread([this] {
      std::deque<int> mine;
      while (!stop_) {
        const int fd = ConnectIdle(port_);
        if (fd >= 0) mine.push_back(fd);
        if (mine.size() > static_cast<size_t>(kIdleAtOnce)) {
          close(mine.front());
          mine.pop_front();
        }
        ++churned_;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      for (int fd : mine) close(fd);
    });
  }
  const std::vector<int>& at_once() const { return at_once_; }
  int churned() const { return churned_.load(); }

 private:
  const int port_;
  std::vector<int> at_once_;
  std::atomic<bool> stop_{false};
  std::atomic<int> churned_{0};
  std::thread churn_;
};

// How many of `fds` the server has closed (their reading end sees the end of the stream).
int ClosedByServer(const std::vector<int>& fds) {
  std::vector<pollfd> polls;
  for (int fd : fds) polls.push_back({fd, POLLIN | POLLRDHUP, 0});
  poll(polls.data(), polls.size(), 0);
  int closed = 0;
  for (const pollfd& p : polls) closed += (p.revents & (POLLIN | POLLRDHUP | POLLHUP)) != 0;
  return closed;
}

struct TimedResponse {
  int status = -1;  // -1: no whole response within the deadline
  double seconds = 0;
  int churned = 0;  // new idle connections the flood opened while it was measured
};

// GET /metrics from a new connection to 127.0.0.1:`port`, with `deadline_s` for all of it:
// connecting, sending, reading the whole response (until the server closes).
TimedResponse TimedScrape(int port, double deadline_s) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(deadline_s));
  const auto left_ms = [&] {
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                 std::chrono::steady_clock::now())
               .count()));
  };
  TimedResponse result;
  const int fd = ConnectIdle(port);
  if (fd < 0) return result;
  pollfd p{fd, POLLOUT, 0};
  std::string response;
  bool complete = false;
  if (poll(&p, 1, left_ms()) == 1 && (p.revents & POLLOUT) != 0) {
    int error = 0;
    socklen_t len = sizeof(error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    if (error == 0 && send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
                          static_cast<ssize_t>(request.size())) {
      char buf[65536];
      while (!complete) {
        p = {fd, POLLIN, 0};
        if (poll(&p, 1, left_ms()) != 1) break;  // the deadline
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EAGAIN) continue;
        if (n <= 0) {
          complete = n == 0;  // closed after the response (a reset is no answer)
          break;
        }
        response.append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (complete && result.seconds <= deadline_s) result.status = StatusOf(response);
  return result;
}

// kFloodScrapes timed scrapes of `port` while `flood` churns, 200 ms apart, each printed as
// it is measured.
std::vector<TimedResponse> ScrapesDuringFlood(int port, const IdleFlood& flood,
                                              const char* server) {
  std::vector<TimedResponse> scrapes;
  for (int i = 0; i < kFloodScrapes; ++i) {
    const int churned_before = flood.churned();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    TimedResponse scrape = TimedScrape(port, kScrapeDeadlineSeconds);
    scrape.churned = flood.churned() - churned_before;
    std::fprintf(stderr, "%s under the flood: scrape %d: %s in %.3f s (%d new idle connections)\n",
                 server, i, scrape.status < 0 ? "no answer" : std::to_string(scrape.status).c_str(),
                 scrape.seconds, scrape.churned);
    scrapes.push_back(scrape);
  }
  return scrapes;
}

// 1000 idle connections opened at once hold a bounded number of the process's descriptors
// (the endpoint accepts each at once and keeps at most kMaxConnections), and while they are
// all still open on the client's side and new idle connections keep coming, every scrape from
// a new connection is answered 200 within 1.5 s.
TEST_F(MetricsEndpointTest, ScrapesAreAnsweredThroughAFloodOfIdleConnections) {
  if (!RaiseDescriptorLimit(4 * kIdleAtOnce)) {
    GTEST_SKIP() << "the hard descriptor limit is below " << 4 * kIdleAtOnce;
  }
  const int before = OpenDescriptors();
  IdleFlood flood(port_);
  ASSERT_EQ(flood.at_once().size(), static_cast<size_t>(kIdleAtOnce));
  // Each accepted at once: all but the kMaxConnections newest closed by the endpoint soon
  // (well before the request timeout would close them anyway).
  const int evicted = kIdleAtOnce - MetricsEndpoint::kMaxConnections;
  const auto start = std::chrono::steady_clock::now();
  int closed = 0;
  while ((closed = ClosedByServer(flood.at_once())) < evicted &&
         std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double accepted_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int held_by_server = OpenDescriptors() - before - static_cast<int>(flood.at_once().size());
  std::fprintf(stderr,
               "%d idle connections: %d closed by the endpoint after %.3f s; it held %d "
               "descriptors\n",
               kIdleAtOnce, closed, accepted_s, held_by_server);
  EXPECT_GE(closed, evicted);
  EXPECT_LE(held_by_server, MetricsEndpoint::kMaxConnections + 4);

  flood.StartChurn();
  for (const TimedResponse& scrape : ScrapesDuringFlood(port_, flood, "the endpoint")) {
    EXPECT_EQ(scrape.status, 200) << "after " << scrape.seconds << " s";
    EXPECT_LT(scrape.seconds, kScrapeDeadlineSeconds);
    EXPECT_GT(scrape.churned, 0);  // the flood went on all along
  }
}

// A thread-per-connection server in miniature (what civetweb's pool is, with one thread):
// it accepts in one thread and serves each connection in turn, reading its request with a
// blocking read of a 3 s timeout. Each idle connection holds it for 3 s.
class BlockingServer {
 public:
  BlockingServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listen_fd_, SOMAXCONN) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("BlockingServer: cannot listen");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        const int fd = accept(listen_fd_, nullptr, nullptr);
        if (fd < 0) continue;  // stopping: shutdown() ends a blocked accept
        timeval tv{3, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        std::string in;
        char buf[4096];
        ssize_t n;
        while (!stop_ && in.find("\r\n\r\n") == std::string::npos &&
               (n = recv(fd, buf, sizeof(buf), 0)) > 0) {
          in.append(buf, static_cast<size_t>(n));
        }
        if (in.find("\r\n\r\n") != std::string::npos) {
          SendAll(fd, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n");
        }
        close(fd);
      }
    });
  }
  ~BlockingServer() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The negative control of the test above: the same flood and the same scrapes against the
// blocking server, which answers one idle connection per 3 s, keep every scrape waiting past
// its deadline, so that test's assertion can fail (and does, for such a server: civetweb's
// 8 threads answered 0 of 7).
TEST(MetricsEndpointFloodControl, ABlockingServerKeepsScrapesWaitingThroughTheSameFlood) {
  if (!RaiseDescriptorLimit(4 * kIdleAtOnce)) {
    GTEST_SKIP() << "the hard descriptor limit is below " << 4 * kIdleAtOnce;
  }
  BlockingServer server;  // destroyed last: the flood's connections are closed first
  {
    IdleFlood flood(server.port());
    flood.StartChurn();
    int answered = 0;
    for (const TimedResponse& scrape :
         ScrapesDuringFlood(server.port(), flood, "a blocking server")) {
      answered += scrape.status == 200;
      EXPECT_GT(scrape.churned, 0);
    }
    EXPECT_EQ(answered, 0);
  }
  // Once the flood is gone, it answers (what the scrapes above failed for was the flood).
  EXPECT_EQ(TimedScrape(server.port(), 5).status, 200);
}

// The destructor stops the endpoint at once, whatever connections are open (idle ones, a
// scrape in line), and closes every descriptor it had; the clients see their connections end.
TEST(MetricsEndpointStop, StopsPromptlyAndClosesEveryDescriptor) {
  Registry registry;
  registry.GetGauge("pipetrain_up", "Serving.", {}, {}).Set(1);
  const int before = OpenDescriptors();
  auto endpoint = MetricsEndpoint::Start("127.0.0.1:0", &registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = PortOf((*endpoint)->address());
  EXPECT_EQ(TimedScrape(port, 5).status, 200);
  std::vector<int> clients;
  for (int i = 0; i < 20; ++i) clients.push_back(ConnectIdle(port));
  // Scrapes in line behind one another (spaced kScrapeSpacingMs apart).
  for (int i = 0; i < 5; ++i) {
    const int fd = Connect(port);
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    clients.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto start = std::chrono::steady_clock::now();
  endpoint->reset();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "stopped in %.4f s\n", seconds);
  EXPECT_LT(seconds, 0.5);
  EXPECT_EQ(OpenDescriptors() - static_cast<int>(clients.size()), before);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ClosedByServer(clients), static_cast<int>(clients.size()));
  for (int fd : clients) close(fd);
  EXPECT_NE(TimedScrape(port, 1).status, 200);  // nothing listens there any more
}

// However many scrape at once, a process starts at most one scrape per kScrapeSpacingMs:
// 16 threads scraping as fast as they can for 2 s make at most 2 s / 100 ms + 1 collections.
TEST_F(MetricsEndpointTest, ScrapeWorkIsSpacedWhateverTheNumberOfScrapers) {
  std::atomic<int> collections{0};
  registry_.AddCollector("pipetrain_collections", "Collections.", {}, [&] {
    ++collections;
    return std::vector<CollectedSample>{{{}, 1}};
  });
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::vector<std::thread> scrapers;
  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < 16; ++t) {
    scrapers.emplace_back([&] {
      while (!stop) {
        if (StatusOf(Scrape()) == 200) ++answered;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const int in_two_seconds = collections.load();
  stop = true;
  for (auto& t : scrapers) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "16 scrapers: %d collections in the first 2 s, %d answered in %.1f s\n",
               in_two_seconds, answered.load(), seconds);
  EXPECT_LE(in_two_seconds, 2000 / MetricsEndpoint::kScrapeSpacingMs + 1);
  EXPECT_GE(in_two_seconds, 5);  // and scrapes are served all the while
}

}  // namespace
}  // namespace pipetrain::metrics
