// The CLI's connection to the coordinator's JobService: the options every job command takes,
// one unary call with the --timeout deadline, and how a failed call is said (one line on
// stderr; the exit code from runtime/base/exit_codes.h; 4 for a refused token, naming the
// coordinator). Not thread-safe: a command uses its JobClient from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>

#include "pipetrain/v1/job_service.grpc.pb.h"
#include "rpc/security.h"

namespace pipetrain::client {

// What every job command takes: --coordinator, -o, --timeout, --token-file, TLS files.
struct ClientOptions {
  std::string coordinator;
  std::string output = "table";
  double timeout_s = 10;
  std::string token_file;
  rpc::SecurityOptions security;           // the token loaded before the command runs
  std::shared_ptr<grpc::Channel> channel;  // made then too, with the token and TLS
};

// The exit code of a failed call: the one table (runtime/base/exit_codes.h).
int ExitFor(const grpc::Status& s);
// Prints "pipetrain: WHAT: why" on stderr; returns ExitFor(s).
int Fail(const grpc::Status& s, const std::string& what);
// `m` as one line of JSON with the proto's field names.
std::string Json(const google::protobuf::Message& m);

class JobClient {
 public:
  explicit JobClient(const ClientOptions& options)
      : options_(options), stub_(v1::JobService::NewStub(options.channel)) {}
  // Prints why a call failed, on one line, and returns the exit code.
  int Fail(const grpc::Status& s, const std::string& what) const;
  // One unary call with the --timeout deadline.
  template <typename Request, typename Response>
  grpc::Status Call(grpc::Status (v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                                 const Request&, Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    return (stub_.get()->*method)(&ctx, request, response);
  }
  // Gives `ctx` the --timeout deadline.
  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)));
  }
  // OK once the channel to the coordinator is ready, within the --timeout; else
  // DEADLINE_EXCEEDED (nothing that speaks gRPC answered). For streaming calls, which have no
  // deadline of their own.
  grpc::Status WaitForCoordinator() const {
    const auto deadline =
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000));
    if (options_.channel->WaitForConnected(deadline)) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no connection within the --timeout");
  }
  // For streaming calls (no deadline: they last as long as what they follow).
  v1::JobService::Stub* stub() { return stub_.get(); }
  std::shared_ptr<grpc::Channel> channel() { return options_.channel; }

 private:
  ClientOptions options_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

// The options of `pipetrain run`'s own calls to its local cluster at `address`: plaintext
// loopback, sending $PIPETRAIN_TOKEN if it is set (the daemons it starts inherit it, and then
// ask for it).
ClientOptions LocalClusterOptions(const std::string& address);

}  // namespace pipetrain::client
