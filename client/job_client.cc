#include "client/job_client.h"

#include <cstdio>

#include <google/protobuf/util/json_util.h>

#include "rpc/status.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"

namespace pipetrain::client {

int ExitFor(const grpc::Status& s) { return exit_code::For(rpc::ToAbslStatus(s)); }

int Fail(const grpc::Status& s, const std::string& what) {
  std::fprintf(stderr, "pipetrain: %s: %s\n", Printable(what).c_str(),
               Printable(s.error_message()).c_str());
  return ExitFor(s);
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

int JobClient::Fail(const grpc::Status& s, const std::string& what) const {
  const std::string where = Printable(options_.coordinator);
  switch (s.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      std::fprintf(stderr, "pipetrain: %s: the coordinator at %s refused the call: %s (give %s)\n",
                   Printable(what).c_str(), where.c_str(), Printable(s.error_message()).c_str(),
                   options_.security.token.empty()
                       ? "--token-file or PIPETRAIN_TOKEN"
                       : "the coordinator's token with --token-file or PIPETRAIN_TOKEN");
      return exit_code::kDenied;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // Nothing answers there, or what answers does not speak gRPC (or not in time).
      std::fprintf(
          stderr, "pipetrain: %s: no coordinator answered at %s (%s: %s)\n",
          Printable(what).c_str(), where.c_str(),
          s.error_code() == grpc::StatusCode::UNAVAILABLE ? "unavailable" : "deadline exceeded",
          Printable(s.error_message()).c_str());
      return exit_code::kUnavailable;
    case grpc::StatusCode::UNIMPLEMENTED:
      // A gRPC server of another kind (a worker's, say).
      std::fprintf(stderr,
                   "pipetrain: %s: %s serves gRPC but is not a pipetrain coordinator (it does "
                   "not know the call: %s)\n",
                   Printable(what).c_str(), where.c_str(), Printable(s.error_message()).c_str());
      return exit_code::kUnavailable;
    default: return client::Fail(s, what);
  }
}

ClientOptions LocalClusterOptions(const std::string& address) {
  ClientOptions options;
  options.coordinator = address;
  options.security.token = rpc::LoadToken("").value_or("");
  auto channel = rpc::MakeChannel(address, options.security);
  options.channel =
      channel.ok() ? *channel : grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  return options;
}

}  // namespace pipetrain::client
