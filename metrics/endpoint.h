// Serves a metrics Registry at GET /metrics with prometheus-cpp's pull exposer (civetweb):
// the text exposition format 0.0.4, gzip when the scraper accepts it. The endpoint has no
// credential (deploy/ exposes it inside the cluster), so whatever reaches its port is held to
// bounds, and none of them can grow a daemon or slow its job much:
//
//  - only GET /metrics: another path is 404, another method 405 (Allow: GET); a request that
//    announces a body (Content-Length > 0 or Transfer-Encoding) is answered 413 and its
//    connection closed without reading any of the body;
//  - the request line and headers together at most kMaxRequestBytes (civetweb refuses more
//    and closes); they must arrive within kRequestTimeoutMs of the connection's
//    first byte (a client dribbling headers is cut off); no keep-alive;
//  - kThreads connections are served at once and kQueuedConnections more wait accepted; the
//    rest wait in the kernel's listen backlog, so a flood of idle connections holds a fixed
//    number of descriptors (it can delay scrapes, never the daemon);
//  - scrape work is spaced: each process starts at most one scrape per kScrapeSpacingMs
//    (10 a second); a scrape waits for its turn (at most kThreads x kScrapeSpacingMs, as at
//    most kThreads are served at once). A scrape's cost (collecting and serializing every
//    series) is thus bounded per second, whatever number of scrapers there are.
//
// Thread-safe; the endpoint's threads only read the registry.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"

namespace prometheus {
class Exposer;
}

namespace pipetrain::metrics {

class MetricsEndpoint {
 public:
  static constexpr int kThreads = 8;
  static constexpr int kQueuedConnections = 16;
  static constexpr int kMaxRequestBytes = 8192;
  static constexpr int kRequestTimeoutMs = 3000;
  static constexpr int kScrapeSpacingMs = 100;

  // Binds `host_port` ("127.0.0.1:9400", "[::1]:0", "0.0.0.0:9400"; port 0: any free port)
  // at once, so that a port in use is an error at start naming it, then serves on threads of
  // its own. `registry` must outlive the endpoint.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host_port,
                                                                 const Registry* registry);
  ~MetricsEndpoint();  // stops serving (in a few ms); in-flight scrapes finish first
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // "host:port" as bound (the real port when 0 was asked for).
  const std::string& address() const { return address_; }

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, std::string address);
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace pipetrain::metrics
