#include "rpc/security.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::rpc {
namespace {

constexpr char kHeader[] = "authorization";
constexpr char kScheme[] = "Bearer ";

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot read it (", std::strerror(errno), ")"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Equal strings, in a time that depends on their lengths only, not on where they differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// Adds `authorization: Bearer <token>` to every call, unless the call already has one.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      auto* metadata = methods->GetSendInitialMetadata();
      if (metadata != nullptr && metadata->count(kHeader) == 0) {
        metadata->emplace(kHeader, value_);
      }
    }
    methods->Proceed();
  }

 private:
  std::string value_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : value_(kScheme + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(value_);
  }

 private:
  std::string value_;
};

}  // namespace

absl::StatusOr<std::string> LoadToken(const std::string& token_file) {
  if (token_file.empty()) {
    const char* env = std::getenv("PIPETRAIN_TOKEN");
    return env ? std::string(absl::StripAsciiWhitespace(env)) : std::string();
  }
  auto text = ReadFile("--token-file", token_file);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token-file ", token_file, ": it is empty"));
  }
  for (char c : token) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--token-file ", token_file, ": the token holds a control character (a line break?); "
          "metadata cannot carry it"));
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options) {
  if (!options.tls()) return grpc::InsecureServerCredentials();
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "a server with TLS needs both --tls-cert and --tls-key (and --tls-ca for mutual TLS)");
  }
  auto cert = ReadFile("--tls-cert", options.tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile("--tls-key", options.tls_key);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      options.tls_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                             : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!options.tls_ca.empty()) {
    auto ca = ReadFile("--tls-ca", options.tls_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  auto credentials = grpc::SslServerCredentials(ssl);
  if (!credentials) {
    return absl::InvalidArgumentError(absl::StrCat("cannot use --tls-cert ", options.tls_cert,
                                                   " and --tls-key ", options.tls_key));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const SecurityOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls()) {
    if (options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert and --tls-key go together (a client certificate and its key)");
    }
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca.empty()) {
      auto ca = ReadFile("--tls-ca", options.tls_ca);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (!options.tls_cert.empty()) {
      auto cert = ReadFile("--tls-cert", options.tls_cert);
      if (!cert.ok()) return cert.status();
      auto key = ReadFile("--tls-key", options.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
    if (!credentials) return absl::InvalidArgumentError("cannot build TLS channel credentials");
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.token.empty()) {
    interceptors.push_back(std::make_unique<TokenInterceptorFactory>(options.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, grpc::ChannelArguments(), std::move(interceptors));
}

void Authorize(grpc::ClientContext& context, const SecurityOptions& options) {
  if (!options.token.empty()) context.AddMetadata(kHeader, kScheme + options.token);
}

grpc::Status CheckToken(const grpc::ServerContext& context, const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto [begin, end] = metadata.equal_range(kHeader);
  bool ok = begin != end && std::next(begin) == end;
  if (ok) {
    const std::string given(begin->second.data(), begin->second.size());
    ok = ConstantTimeEquals(given, kScheme + token);
  }
  if (ok) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong token");
}

bool IsLoopback(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) {
    return true;
  }
  std::string host;
  if (absl::StartsWith(listen, "[")) {
    host = listen.substr(1, listen.find(']') == std::string::npos ? std::string::npos
                                                                   : listen.find(']') - 1);
  } else {
    const size_t colon = listen.rfind(':');
    host = colon == std::string::npos ? listen : listen.substr(0, colon);
  }
  host = absl::AsciiStrToLower(host);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

std::string ListenWarning(const std::string& listen, const SecurityOptions& options) {
  if (IsLoopback(listen)) return "";
  const bool mutual_tls = !options.tls_cert.empty() && !options.tls_ca.empty();
  if (options.token.empty() && !mutual_tls) {
    return absl::StrCat("warning: listening on ", listen,
                        ", reachable from other machines, with neither a token nor mutual "
                        "TLS: anyone who reaches it can control it. Give --token-file (or "
                        "$PIPETRAIN_TOKEN), and --tls-cert/--tls-key/--tls-ca across networks "
                        "you do not trust.");
  }
  if (!options.tls()) {
    return absl::StrCat("warning: listening on ", listen,
                        " without TLS: the token crosses the network in plaintext. Add "
                        "--tls-cert/--tls-key (and --tls-ca for mutual TLS) unless the "
                        "network is trusted.");
  }
  return "";
}

}  // namespace pipetrain::rpc
