#include "metrics/http_server.h"

#include <cerrno>
#include <cstring>
#include <thread>

#include <httplib.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::metrics {

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() {
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host_port,
                                                                    const Registry* registry) {
  const size_t colon = host_port.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port) ||
      port < 0 || port > 65535 || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen: expected HOST:PORT (port 0: any free one), got '", host_port, "'"));
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto impl = std::make_unique<Impl>();
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a second daemon
  // on the same port would share it silently instead of failing to start.
  impl->server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl->server.Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  impl->server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content(absl::StrCat("no such path: ", req.path, " (metrics are at /metrics)\n"),
                      "text/plain");
    }
  });
  const int bound = port == 0 ? impl->server.bind_to_any_port(host)
                              : (impl->server.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics-listen ", host_port, ": cannot listen there (", std::strerror(errno),
        "; is the port in use?)"));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  const std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(impl), absl::StrCat(shown_host, ":", bound)));
}

}  // namespace pipetrain::metrics
