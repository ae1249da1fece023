// The coordinator's gRPC server: JobService for clients and CoordinatorService for workers
// over one Coordinator, with standard health checking and server reflection.
//
// With a token in ServerOptions::security, every JobService and CoordinatorService call
// without it is answered UNAUTHENTICATED before it reaches a handler (the server's
// credentials check it: rpc/security.h). Health and reflection stay open.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "metrics/metrics.h"
#include "rpc/security.h"

namespace pipetrain::coordinator {

struct ServerOptions {
  std::string listen = "127.0.0.1:7070";  // host:port; port 0 picks a free one
  rpc::SecurityOptions security;          // token asked of callers; TLS
  // Where every call's duration is recorded (pipetrain_rpc_duration_seconds); may be null.
  metrics::Registry* metrics = nullptr;
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Coordinator* coordinator,
                                                                  const ServerOptions& options);
  ~CoordinatorServer();
  int port() const { return port_; }
  void Shutdown();
  void Wait() { server_->Wait(); }

 private:
  CoordinatorServer() = default;
  // Health follows the coordinator's state loop (Coordinator::StateLoopLive), checked every
  // half second.
  void WatchStateLoop(Coordinator* coordinator);
  std::unique_ptr<grpc::Service> job_service_, coordinator_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::atomic<bool> streams_stop_{false};  // read by the streaming calls
  std::thread watchdog_;
};

}  // namespace pipetrain::coordinator
