#include "rpc/security.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "runtime/base/host_port.h"

namespace pipetrain::rpc {
namespace {

constexpr char kHeader[] = "authorization";
constexpr char kScheme[] = "Bearer ";
constexpr char kRefused[] = "missing or wrong token";

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
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

absl::string_view View(const grpc_slice& slice) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(slice)),
                           GRPC_SLICE_LENGTH(slice));
}

// The services any caller may use: health checking and reflection.
bool IsOpen(absl::string_view path) {
  return absl::StartsWith(path, "/grpc.health.v1.Health/") ||
         absl::StartsWith(path, "/grpc.reflection.v1alpha.ServerReflection/") ||
         absl::StartsWith(path, "/grpc.reflection.v1.ServerReflection/");
}

// The header values a server asks for: of the workers' service, and of every other one
// (empty: none asked).
struct ExpectedTokens {
  std::string worker, user;
  const std::string& For(absl::string_view path) const {
    return absl::StartsWith(path, "/pipetrain.v1.CoordinatorService/") ? worker : user;
  }
};

// The token check, as gRPC's server auth filter runs it on every call's initial metadata
// before the call reaches the server's methods. `state` is the ExpectedTokens.
void CheckToken(void* state, grpc_auth_context* /*context*/, const grpc_metadata* metadata,
                size_t count, grpc_process_auth_metadata_done_cb done, void* user_data) {
  const ExpectedTokens& tokens_asked = *static_cast<const ExpectedTokens*>(state);
  absl::string_view path;
  int tokens = 0;
  bool matches = false;
  for (size_t i = 0; i < count; ++i) {
    if (View(metadata[i].key) == ":path") path = View(metadata[i].value);
  }
  const std::string& expected = tokens_asked.For(path);
  for (size_t i = 0; i < count; ++i) {
    if (View(metadata[i].key) == kHeader) {
      ++tokens;
      matches = ConstantTimeEquals(View(metadata[i].value), expected);
    }
  }
  if (expected.empty() || (tokens == 1 && matches) || IsOpen(path)) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  } else {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, kRefused);
  }
}

// gRPC's server credentials (plaintext or TLS) as its C core makes them, which, unlike the
// C++ InsecureServerCredentials, take an auth metadata processor: the token check, when
// there is a token. ServerBuilder::AddListeningPort binds through AddPortToServer.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  // `tls`: null for plaintext, else the certificate, key and, for mutual TLS, the CA.
  CoreServerCredentials(const grpc::SslServerCredentialsOptions* tls, const std::string& token,
                        const std::string& worker_token) {
    if (tls == nullptr) {
      credentials_ = grpc_insecure_server_credentials_create();
    } else {
      grpc_ssl_pem_key_cert_pair pair = {tls->pem_key_cert_pairs[0].private_key.c_str(),
                                         tls->pem_key_cert_pairs[0].cert_chain.c_str()};
      credentials_ = grpc_ssl_server_credentials_create_ex(
          tls->pem_root_certs.empty() ? nullptr : tls->pem_root_certs.c_str(), &pair, 1,
          tls->client_certificate_request, nullptr);
    }
    if (credentials_ != nullptr && (!token.empty() || !worker_token.empty())) {
      const std::string& for_workers = worker_token.empty() ? token : worker_token;
      auto* expected = new ExpectedTokens{for_workers.empty() ? "" : kScheme + for_workers,
                                          token.empty() ? "" : kScheme + token};
      grpc_server_credentials_set_auth_metadata_processor(
          credentials_,
          {CheckToken, [](void* state) { delete static_cast<ExpectedTokens*>(state); }, expected});
    }
  }
  ~CoreServerCredentials() override {
    if (credentials_ != nullptr) grpc_server_credentials_release(credentials_);
  }
  bool valid() const { return credentials_ != nullptr; }

  // Another processor would replace the token check: refused as loudly as gRPC refuses one
  // on its own plaintext credentials.
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    std::fprintf(stderr,
                 "pipetrain: rpc::MakeServerCredentials' credentials check the token "
                 "themselves; another AuthMetadataProcessor cannot be set\n");
    std::abort();
  }

 private:
  int AddPortToServer(const std::string& address, grpc_server* server) override {
    return grpc_server_add_http2_port(server, address.c_str(), credentials_);
  }

  grpc_server_credentials* credentials_ = nullptr;
};

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

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(const std::string& token) : value_(kScheme + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(value_);
  }

 private:
  std::string value_;
};

// Adds the worker's current session to every call, when it has one.
class SessionInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit SessionInterceptor(std::shared_ptr<const WorkerSession> session)
      : session_(std::move(session)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      auto* metadata = methods->GetSendInitialMetadata();
      std::string value = session_->Get();
      if (metadata != nullptr && !value.empty() && metadata->count(WorkerSession::kHeader) == 0) {
        metadata->emplace(WorkerSession::kHeader, std::move(value));
      }
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<const WorkerSession> session_;
};

class SessionInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SessionInterceptorFactory(std::shared_ptr<const WorkerSession> session)
      : session_(std::move(session)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new SessionInterceptor(session_);
  }

 private:
  std::shared_ptr<const WorkerSession> session_;
};

}  // namespace

std::string SessionOf(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (metadata.count(WorkerSession::kHeader) != 1) return "";
  const grpc::string_ref value = metadata.find(WorkerSession::kHeader)->second;
  return std::string(value.data(), value.size());
}

std::string RandomKey() {
  std::random_device entropy;
  std::string key;
  for (int i = 0; i < 4; ++i) key += absl::StrFormat("%08x", entropy());
  return key;
}

bool CarriesCommandKey(const grpc::ServerContext& context, const std::string& key) {
  const auto& metadata = context.client_metadata();
  if (key.empty() || metadata.count(kCommandKeyHeader) != 1) return false;
  const grpc::string_ref value = metadata.find(kCommandKeyHeader)->second;
  return ConstantTimeEquals(absl::string_view(value.data(), value.size()), key);
}

void AddCommandKey(grpc::ClientContext& context, const std::string& key) {
  context.AddMetadata(kCommandKeyHeader, key);
}

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
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", token_file,
                       ": the token holds a control character (a line break?); "
                       "metadata cannot carry it"));
    }
  }
  return token;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options) {
  if (!options.tls())
    return std::make_shared<CoreServerCredentials>(nullptr, options.token, options.worker_token);
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
  auto credentials =
      std::make_shared<CoreServerCredentials>(&ssl, options.token, options.worker_token);
  if (!credentials->valid()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot use --tls-cert ", options.tls_cert,
                                                   " and --tls-key ", options.tls_key));
  }
  return credentials;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const SecurityOptions& options,
    std::shared_ptr<const WorkerSession> session) {
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
  if (session != nullptr) {
    interceptors.push_back(std::make_unique<SessionInterceptorFactory>(std::move(session)));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, ReconnectingChannelArguments(), std::move(interceptors));
}

grpc::ChannelArguments ReconnectingChannelArguments() {
  grpc::ChannelArguments arguments;
  // gRPC's defaults (a first retry after 1 s, growing by 1.6 to 120 s) leave a daemon that was
  // out of reach for a minute up to a minute more without a connection after it is back.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectInitialBackoffMs);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kReconnectMaxBackoffMs);
  // In gRPC's core this is the shortest a connection attempt is given (20 s by default): an
  // attempt into a cut link ends after it, and the next starts.
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectTimeoutMs);
  return arguments;
}

void Authorize(grpc::ClientContext& context, const SecurityOptions& options) {
  if (!options.token.empty()) context.AddMetadata(kHeader, kScheme + options.token);
}

bool IsLoopback(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) {
    return true;
  }
  return IsLoopbackHost(HostOf(listen));
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
