// Serves a metrics Registry at GET /metrics: the text exposition format 0.0.4 of
// Registry::Render(), gzip-compressed when the scraper accepts it. HTTP is served here, by
// one event-loop thread (epoll, non-blocking sockets) and one rendering thread, so that no
// number of connections can hold a thread: a scrape is answered while any number of idle or
// slow connections are open. The endpoint has no credential (deploy/ exposes it inside the
// cluster), so whatever reaches its port is held to bounds, and none of them can grow a
// daemon or slow its job much:
//
//  - only GET /metrics (a query string is allowed): another path is 404, another method 405
//    (Allow: GET); a request that announces a body (Content-Length > 0 or any
//    Transfer-Encoding) is answered 413 and its connection closed without reading the body;
//    no keep-alive: every response says Connection: close and its connection is closed;
//  - the request line and headers together at most kMaxRequestBytes (more: 431 and close);
//    they must be complete within kRequestTimeoutMs of the connection's accept (a client
//    dribbling headers, or sending nothing, is closed then); a response not fully written
//    within kWriteTimeoutMs of being ready is dropped with its connection;
//  - every connection is accepted at once (the kernel's listen backlog stays empty) and at
//    most kMaxConnections are kept: one more closes the connection that has waited longest
//    without a complete request (read once more first), or, when every one has a request in
//    line or a response being written, is itself answered 503 and closed. A flood of idle
//    connections thus holds at most kMaxConnections descriptors (each with a buffer of at most
//    kMaxRequestBytes), and it crowds a scrape out only if kMaxConnections newer connections
//    arrive before the scrape's request does;
//  - scrape work is spaced: each process starts at most one scrape (a collection and
//    serialization of the registry) per kScrapeSpacingMs, whatever number of scrapers or
//    endpoints there are. Complete scrape requests wait in line (at most kMaxConnections of
//    them, so at most kMaxConnections x kScrapeSpacingMs) and are rendered one at a time by
//    the rendering thread; the event loop never waits for a scrape.
//
// What a request head asks for, the responses and gzip: http_messages.h.
//
// Thread-safe: Start and the destructor may run on any thread, address() is constant. The
// endpoint's rendering thread only calls registry->Render(); the event loop never touches
// the registry. Neither keeps the registry alive: the caller keeps it alive until the
// endpoint is destroyed.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"

namespace pipetrain::metrics {

class MetricsEndpoint {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr int kMaxRequestBytes = 8192;
  static constexpr int kRequestTimeoutMs = 3000;
  static constexpr int kWriteTimeoutMs = 10000;
  static constexpr int kScrapeSpacingMs = 100;

  // Binds `host_port` ("127.0.0.1:9400", "[::1]:0", "0.0.0.0:9400"; port 0: any free port)
  // at once and exclusively, so that a port in use is an error at start naming it
  // (Unavailable: "--metrics-listen HOST:PORT: cannot listen there (...; is the port in
  // use?)"; a HOST:PORT that is not an IP address and a port: InvalidArgument), then serves
  // on two threads of its own. `registry` must outlive the endpoint.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& host_port,
                                                                const Registry* registry);
  // Stops serving within milliseconds and closes every descriptor: a scrape being rendered
  // is finished first; those waiting in line and responses not yet written are dropped with
  // their connections.
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // "host:port" as bound (the real port when 0 was asked for).
  const std::string& address() const { return address_; }

 private:
  class Server;
  MetricsEndpoint(std::unique_ptr<Server> server, std::string address);
  std::unique_ptr<Server> server_;
  std::string address_;
};

}  // namespace pipetrain::metrics
