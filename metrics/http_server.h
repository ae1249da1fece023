// Serves a metrics Registry over HTTP: GET /metrics answers the text exposition format
// (Content-Type text/plain; version=0.0.4); any other path is 404, any other method 405.
// Each request renders the registry once; nothing a scrape does touches a stage's thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"

namespace pipetrain::metrics {

class MetricsServer {
 public:
  // Binds `host_port` ("127.0.0.1:9400", "[::1]:0", "0.0.0.0:9400"; port 0: any free port)
  // at once, so that a port in use is an error at start naming it, then serves on a thread
  // of its own. `registry` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host_port,
                                                               const Registry* registry);
  ~MetricsServer();  // stops serving; in-flight scrapes finish first
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" as bound (the real port when 0 was asked for).
  const std::string& address() const { return address_; }

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace pipetrain::metrics
