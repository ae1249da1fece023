// Who may call the control plane: a shared token and, optionally, TLS or mutual TLS, shared
// by the coordinator, the workers and the pipetrain CLI.
//
// - Token: when a server has one, every call to it must carry the metadata
//   `authorization: Bearer <token>` (exactly once); any other call is answered
//   UNAUTHENTICATED ("missing or wrong token") before it reaches any handler, so it changes
//   nothing. The comparison takes the same time wherever the tokens differ. The token is
//   read from a file (--token-file) or from $PIPETRAIN_TOKEN, never from the command line,
//   and is never printed.
// - TLS: with a certificate and key a server speaks TLS; with a CA as well it requires and
//   verifies a client certificate signed by that CA (mutual TLS). Clients verify the server
//   against the CA (the system roots without one) and present their certificate if given.
//   The daemons use one certificate both ways (coordinator <-> workers), so it must be valid
//   for server and client authentication and name the address it is reached at.
// - Plaintext on loopback with no token is the default. A daemon listening on any other
//   address without a token or mutual TLS is told so (ListenWarning).
// - People and workers: a coordinator given a separate worker token (--worker-token-file)
//   asks it of the workers' service and the user token of everything else, so the CLI's
//   token cannot register a worker and a worker's cannot submit or cancel jobs. Each
//   registered worker then speaks with its own session (WorkerSession below).
// - Left open without a token: gRPC health checking (grpc.health.v1.Health, for probes
//   such as Kubernetes' that cannot send a token; it reveals only serving or not) and server
//   reflection (the service schema, public anyway). TLS, when configured, covers them too.
//
// The server side is one check on the server's credentials (MakeServerCredentials): an
// auth metadata processor that gRPC's core runs on every incoming call's initial metadata
// (which holds `:path`) before the call is matched to a method. No handler checks anything,
// and a method added later is covered without a line of code. Not an interceptor: gRPC C++
// 1.51's server interceptors cannot end a call before its handler (hijacking is for client
// interceptors). Not the C++ credentials' SetAuthMetadataProcessor: InsecureServerCredentials
// aborts on it, and LocalServerCredentials would refuse every peer not on loopback. So the
// credentials are made with gRPC's C API (grpc_insecure_server_credentials_create, or
// grpc_ssl_server_credentials_create_ex for TLS), which takes a processor either way, and
// bound through a grpc::ServerCredentials subclass (AddPortToServer, as gRPC 1.51 declares
// it). The client side is a channel interceptor (MakeChannel) that adds the token to every
// call on the channel, so no call site can forget it.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace pipetrain::rpc {

struct SecurityOptions {
  std::string token;     // the shared token; empty: none asked for (server) or sent (client)
  std::string tls_cert;  // PEM files; all three empty: plaintext
  std::string tls_key;
  std::string tls_ca;  // server: require client certificates signed by it (mutual TLS)
  // Server only: the join token asked of workers (pipetrain.v1.CoordinatorService) instead of
  // `token`, which then serves people (the CLI) only; empty: `token` serves both.
  std::string worker_token;
  bool tls() const { return !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty(); }
};

// The token in `token_file` (surrounding whitespace dropped) if a file is named, else
// $PIPETRAIN_TOKEN, else "" (no token). An unreadable or empty file is an error naming the
// file; the error never contains the token.
absl::StatusOr<std::string> LoadToken(const std::string& token_file);

// The credentials of every server of the control plane: plaintext without TLS files, TLS
// (mutual with a CA) with them, and with `options.token` the token check above on every
// call. Errors name the flag and file at fault (a certificate without its key, an
// unreadable file). Setting another AuthMetadataProcessor on them aborts (it would replace
// the token check).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& options);

// A worker's own credential with the coordinator: RegisterWorker hands each worker a fresh
// random session, and every later call of that worker carries it as metadata
// `x-pipetrain-session`, so the coordinator knows which worker calls (the shared token only
// says that the caller belongs to the cluster). It changes when the worker registers again.
class WorkerSession {
 public:
  static constexpr char kHeader[] = "x-pipetrain-session";
  void Set(std::string value) {
    std::lock_guard<std::mutex> lock(mu_);
    value_ = std::move(value);
  }
  std::string Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return value_;
  }

 private:
  mutable std::mutex mu_;
  std::string value_;
};

// The session a call carried ("" if none), on the server side.
std::string SessionOf(const grpc::ServerContext& context);

// The coordinator's credential with one worker: each worker makes a random command key of
// its own and registers with it; the coordinator sends it (metadata
// `x-pipetrain-command-key`) with every call to that worker, and the worker takes only calls
// that carry it. The join token cannot command a worker: other workers and people hold that
// token but never the key.
inline constexpr char kCommandKeyHeader[] = "x-pipetrain-command-key";

// 32 random hex digits (std::random_device): a session or a command key.
std::string RandomKey();

// Whether `context` carries `key` as its command key (compared in constant time); false for
// an empty `key` (a worker not yet registered takes no command).
bool CarriesCommandKey(const grpc::ServerContext& context, const std::string& key);

// Adds the command key to one call's metadata.
void AddCommandKey(grpc::ClientContext& context, const std::string& key);

// A channel to `target` with TLS as configured that sends the token, if any, with every
// call (including health checks, which ignore it), and the worker's session, if given and
// set, with every call. It reconnects as ReconnectingChannelArguments says.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const std::string& target, const SecurityOptions& options,
    std::shared_ptr<const WorkerSession> session = nullptr);

// How every channel of the daemons and the CLI reconnects to a peer that went away: the first
// attempt 100 ms after the connection failed, then at most a second apart, each attempt given
// at least a second to connect. So a worker finds a coordinator that is back (restarted, or
// its link healed) within about a second, however long it was gone: an outage costs no more
// than the outage.
inline constexpr int kReconnectInitialBackoffMs = 100;
inline constexpr int kReconnectMaxBackoffMs = 1000;
inline constexpr int kConnectTimeoutMs = 1000;
grpc::ChannelArguments ReconnectingChannelArguments();

// Adds the token, if any, to one call's metadata: for calls on channels not made by
// MakeChannel (MakeChannel's channels already send it).
void Authorize(grpc::ClientContext& context, const SecurityOptions& options);

// Whether `listen` (host:port, [v6]:port or unix:path) is reachable only from this machine.
bool IsLoopback(const std::string& listen);

// A warning to print when a server on `listen` would take calls from other machines with
// neither a token nor mutual TLS; empty when there is nothing to warn about.
std::string ListenWarning(const std::string& listen, const SecurityOptions& options);

}  // namespace pipetrain::rpc
