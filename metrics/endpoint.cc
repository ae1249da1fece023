#include "metrics/endpoint.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CivetServer.h>  // CivetCallbacks
#include <civetweb.h>
#include <prometheus/exposer.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

// civetweb 1.15 as Debian builds it starts its threads with a fixed stack of about 100 KiB,
// and a thread's stack must also hold the static thread-local storage of every library in
// the process: in a worker (OpenBLAS alone has 60 KiB of it, glog, NCCL and LibTorch more)
// that is larger, pthread_create fails with EINVAL and civetweb cannot start ("Cannot create
// threads"). The process's own definition of pthread_attr_setstacksize comes before libc's
// for every library, so a stack asked below kMinThreadStackBytes is given that much instead
// (address space only; pages are touched as used). Every other call is passed on unchanged.
namespace {
constexpr size_t kMinThreadStackBytes = size_t{1} << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize libc_set_stack_size =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  if (libc_set_stack_size == nullptr) return ENOSYS;
  return libc_set_stack_size(attr, std::max(size, kMinThreadStackBytes));
}

namespace pipetrain::metrics {
namespace {

using Clock = std::chrono::steady_clock;

// Answers a request without a body itself, closing the connection; returns `status` (what
// civetweb logs for a request its begin_request callback handled).
int Reply(mg_connection* conn, int status, const std::string& body,
          const char* allow = nullptr) {
  mg_response_header_start(conn, status);
  mg_response_header_add(conn, "Content-Type", "text/plain; charset=utf-8", -1);
  mg_response_header_add(conn, "Content-Length", std::to_string(body.size()).c_str(), -1);
  mg_response_header_add(conn, "Connection", "close", -1);
  if (allow != nullptr) mg_response_header_add(conn, "Allow", allow, -1);
  mg_response_header_send(conn);
  mg_write(conn, body.data(), body.size());
  return status;
}

// What civetweb last complained of (its log_message callback), for the error of a failed
// start.
std::mutex civetweb_log_mu;
std::string civetweb_last_error;

int KeepCivetwebMessage(const mg_connection*, const char* message) {
  std::lock_guard<std::mutex> lock(civetweb_log_mu);
  civetweb_last_error = message != nullptr ? message : "";
  return 1;  // handled: civetweb prints nothing itself
}

// The process's scrape schedule: the time the next scrape may start. Shared by every
// endpoint of the process (a daemon has one), since the bound is on the process's work.
std::mutex schedule_mu;
Clock::time_point next_scrape_start;

// Waits for this scrape's turn: at most kThreads - 1 others are ahead of it, so at most
// kThreads x kScrapeSpacingMs.
void WaitForScrapeTurn() {
  Clock::time_point turn;
  {
    std::lock_guard<std::mutex> lock(schedule_mu);
    turn = std::max(Clock::now(), next_scrape_start);
    next_scrape_start = turn + std::chrono::milliseconds(MetricsEndpoint::kScrapeSpacingMs);
  }
  std::this_thread::sleep_until(turn);
}

// civetweb's begin_request: every request passes here first; only a scrape of /metrics
// whose turn has come goes on to prometheus-cpp's handler (returning 0).
int AdmitRequest(mg_connection* conn) {
  const mg_request_info* request = mg_get_request_info(conn);
  // A body is refused first, whatever the method or path, through civetweb's own error reply:
  // it marks the connection to be closed, so that the body is never read (a reply of our
  // own would have civetweb read and discard it first, however large).
  if (request->content_length > 0 || mg_get_header(conn, "Transfer-Encoding") != nullptr) {
    mg_send_http_error(conn, 413, "%s", "this endpoint reads no request body\n");
    return 413;
  }
  const char* path = request->local_uri != nullptr ? request->local_uri : "";
  if (std::strcmp(path, "/metrics") != 0) {
    std::string shown(path, std::min<size_t>(std::strlen(path), 200));
    return Reply(conn, 404, absl::StrCat("no such path: ", shown, " (metrics are at /metrics)\n"));
  }
  if (std::strcmp(request->request_method, "GET") != 0) {
    return Reply(conn, 405, "only GET /metrics is served\n", "GET");
  }
  WaitForScrapeTurn();
  return 0;
}

}  // namespace

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                                 std::string address)
    : exposer_(std::move(exposer)), address_(std::move(address)) {}

MetricsEndpoint::~MetricsEndpoint() {
  // civetweb's listening thread notices that it is stopped only when its poll() returns,
  // which without a connection takes up to 2 s: connections to the port, until it has
  // stopped, wake it at once (the daemons exit within a fraction of a second).
  const size_t colon = address_.rfind(':');
  std::string host = address_.substr(0, colon);
  const int port = std::atoi(address_.c_str() + colon + 1);
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "[::]") host = "[::1]";
  const bool ipv6 = !host.empty() && host.front() == '[';
  if (ipv6) host = host.substr(1, host.size() - 2);
  std::atomic<bool> stopped{false};
  std::thread waker([&] {
    while (!stopped.load()) {
      const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        sockaddr_storage addr{};
        socklen_t len = 0;
        if (ipv6) {
          auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
          a6->sin6_family = AF_INET6;
          a6->sin6_port = htons(static_cast<uint16_t>(port));
          inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr);
          len = sizeof(sockaddr_in6);
        } else {
          auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
          a4->sin_family = AF_INET;
          a4->sin_port = htons(static_cast<uint16_t>(port));
          inet_pton(AF_INET, host.c_str(), &a4->sin_addr);
          len = sizeof(sockaddr_in);
        }
        (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), len);
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  exposer_.reset();  // civetweb stops and joins its threads
  stopped = true;
  waker.join();
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& host_port, const Registry* registry) {
  const size_t colon = host_port.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) ||
      port < 0 || port > 65535 || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: expected HOST:PORT (port 0: any free one), got '", host_port, "'"));
  }
  std::string host = host_port.substr(0, colon);
  const bool bracketed = host.size() >= 2 && host.front() == '[' && host.back() == ']';
  if (bracketed) host = host.substr(1, host.size() - 2);
  const bool ipv6 = host.find(':') != std::string::npos;
  if (host.empty() || host.find_first_of("[], ") != std::string::npos || (ipv6 && !bracketed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: expected HOST:PORT with an IP address as host ([::1] for IPv6), "
        "got '", host_port, "'"));
  }
  const std::string shown_host = ipv6 ? "[" + host + "]" : host;
  CivetCallbacks callbacks;  // every callback unset
  callbacks.begin_request = AdmitRequest;
  callbacks.log_message = KeepCivetwebMessage;
  std::vector<std::string> options = {
      "listening_ports", absl::StrCat(shown_host, ":", port),
      "num_threads", std::to_string(kThreads),
      "connection_queue", std::to_string(kQueuedConnections),
      "listen_backlog", "128",
      "max_request_size", std::to_string(kMaxRequestBytes),
      "request_timeout_ms", std::to_string(kRequestTimeoutMs),
      "enable_keep_alive", "no",
  };
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(options, &callbacks);
  } catch (const std::exception&) {
    std::lock_guard<std::mutex> lock(civetweb_log_mu);
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", host_port,
                                               ": cannot listen there (", civetweb_last_error,
                                               "; is the port in use?)"));
  }
  exposer->RegisterCollectable(registry->collectable());
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-listen ", host_port, ": cannot listen there (is the port in use?)"));
  }
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), absl::StrCat(shown_host, ":", ports.front())));
}

}  // namespace pipetrain::metrics
