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
  if (ExitFor(s) != exit_code::kDenied) return client::Fail(s, what);
  std::fprintf(stderr, "pipetrain: %s: the coordinator at %s refused the call: %s (give %s)\n",
               Printable(what).c_str(), options_.coordinator.c_str(),
               Printable(s.error_message()).c_str(),
               options_.security.token.empty()
                   ? "--token-file or PIPETRAIN_TOKEN"
                   : "the coordinator's token with --token-file or PIPETRAIN_TOKEN");
  return exit_code::kDenied;
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
