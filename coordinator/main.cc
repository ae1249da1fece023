// pipetrain-coordinator: takes jobs from the pipetrain CLI, assigns their stages to
// registered workers, follows them, and keeps every job and event in a SQLite file.
//
//   pipetrain-coordinator [--listen 127.0.0.1:7070] [--db pipetrain-coordinator.db]
//                         [--heartbeat-ms 1000] [--token-file PATH] [--worker-token-file PATH]
//                         [--tls-cert PEM --tls-key PEM [--tls-ca PEM]]
//
// Once it serves it writes HOST:PORT to --port-file (if given) and says so on stderr.
// SIGTERM or SIGINT: stops.
// The token (--token-file, else $PIPETRAIN_TOKEN) is asked of every client and worker and
// sent to workers; with --worker-token-file, workers are asked (and sent) that one instead,
// and the first serves people only; see rpc/security.h. Exit codes (runtime/base/exit_codes.h): 0
// stopped, 2 bad usage (an unreadable token or TLS file), 5 cannot open the database or listen.
#include <csignal>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/service.h"
#include "metrics/endpoint.h"
#include "rpc/protobuf_logs.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/host_port.h"
#include "runtime/base/printable.h"
#include "runtime/base/regular_file.h"
#include "runtime/planner/profile_json.h"

namespace {

// One line on stderr, "pipetrain-coordinator: TEXT", TEXT escaped (it may hold what a flag said).
void Say(const std::string& text) {
  std::fprintf(stderr, "pipetrain-coordinator: %s\n", pipetrain::Printable(text).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // absl's lock-order checking (on in this build of absl) is a debugging aid: it records
  // every Mutex gRPC and the daemon take, a tenth of a busy coordinator's CPU. Off in the
  // daemons; the tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace pipetrain::coordinator;
  namespace exit_code = pipetrain::exit_code;
  pipetrain::rpc::QuietMalformedRequestLogs();
  CLI::App app{
      "pipetrain-coordinator: the control plane of pipetrain. Takes jobs from the "
      "pipetrain CLI, assigns their pipeline stages to registered workers, follows "
      "them, and keeps every job and its events in a SQLite file that survives "
      "restarts."};
  ServerOptions server_options;
  CoordinatorOptions options;
  int64_t heartbeat_ms = 1000;
  app.add_option("--listen", server_options.listen,
                 "host:port to serve on (port 0: any free port); loopback by default")
      ->capture_default_str();
  std::string port_file;
  app.add_option("--port-file", port_file,
                 "once serving, write the host:port it listens on to this file, and a second "
                 "line 'metrics HOST:PORT' (written whole or not at all: read it to find a "
                 "coordinator started with port 0)");
  std::string metrics_listen = "127.0.0.1:0";
  app.add_option("--metrics-listen", metrics_listen,
                 "host:port of its Prometheus endpoint, GET /metrics (port 0: any free port; "
                 "\"\": none)")
      ->capture_default_str();
  app.add_option("--db", options.db_path, "SQLite file of jobs and events")->capture_default_str();
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "workers heartbeat this often; one silent for two intervals is lost")
      ->check(CLI::Range(int64_t{10}, int64_t{600000}))
      ->capture_default_str();
  std::string token_file;
  pipetrain::rpc::SecurityOptions& security = server_options.security;
  app.add_option("--token-file", token_file,
                 "file holding the token every client and worker must present, and that is "
                 "sent to workers (default: $PIPETRAIN_TOKEN; none: no token asked)");
  std::string worker_token_file;
  app.add_option("--worker-token-file", worker_token_file,
                 "file holding a separate join token for workers: asked of every worker call "
                 "and sent to workers, while --token-file's then serves people (the CLI) "
                 "only (default: none, --token-file's serves both)");
  app.add_option("--tls-cert", security.tls_cert,
                 "PEM certificate: serve TLS (also presented "
                 "to workers as its client certificate)");
  app.add_option("--tls-key", security.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", security.tls_ca,
                 "PEM CA: require client certificates signed by it (mutual TLS) and verify "
                 "workers against it");
  std::string placement = "topology";
  app.add_option("--placement", placement,
                 "where a job's ranks go when the idle workers are on several hosts (as they "
                 "registered, --host-name): topology, the placement that keeps the job's "
                 "heaviest traffic within hosts (stage boundaries or AllReduce groups, as the "
                 "simulation of its traffic says); in-order, the workers in registration "
                 "order whatever their hosts")
      ->check(CLI::IsMember({"topology", "in-order"}))
      ->capture_default_str();
  std::string host_links_file;
  app.add_option("--host-links", host_links_file,
                 "the links between hosts as `pipetrain profile-link` measured them (default: "
                 "1 Gbit/s and 200 us assumed)")
      ->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  options.heartbeat_interval = absl::Milliseconds(heartbeat_ms);
  options.host_policy = placement == "in-order" ? HostPolicy::kInOrder : HostPolicy::kTopology;
  if (!host_links_file.empty()) {
    absl::StatusOr<std::string> text =
        pipetrain::ReadRegularFile(host_links_file, 1 << 20, "host links");
    absl::StatusOr<pipetrain::planner::HostLinks> links =
        text.ok() ? pipetrain::planner::HostLinksFromJson(*text)
                  : absl::StatusOr<pipetrain::planner::HostLinks>(text.status());
    if (!links.ok()) {
      Say(absl::StrCat("--host-links ", host_links_file, ": ", links.status().message()));
      return exit_code::kUsage;
    }
    options.host_links = *links;
  }
  auto token = pipetrain::rpc::LoadToken(token_file);
  if (!token.ok()) {
    Say(std::string(token.status().message()));
    return exit_code::kUsage;
  }
  security.token = *std::move(token);
  if (!worker_token_file.empty()) {
    auto worker_token = pipetrain::rpc::LoadToken(worker_token_file);
    if (!worker_token.ok()) {
      Say(absl::StrCat("--worker-token-file: ", worker_token.status().message()));
      return exit_code::kUsage;
    }
    security.worker_token = *std::move(worker_token);
  }
  options.security = security;  // for its calls to workers, with the workers' token
  if (!security.worker_token.empty()) options.security.token = security.worker_token;
  if (const std::string warning = pipetrain::rpc::ListenWarning(server_options.listen, security);
      !warning.empty()) {
    Say(warning);
  }

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // every thread; sigwait below takes them

  pipetrain::metrics::Registry registry;  // outlives everything that feeds or serves it
  server_options.metrics = &registry;
  auto coordinator = Coordinator::Open(options);
  if (!coordinator.ok()) {
    Say(std::string(coordinator.status().message()));
    return exit_code::kUnavailable;
  }
  RegisterCoordinatorMetrics(&registry, coordinator->get());
  std::unique_ptr<pipetrain::metrics::MetricsEndpoint> metrics_endpoint;
  if (!metrics_listen.empty()) {
    auto started = pipetrain::metrics::MetricsEndpoint::Start(metrics_listen, &registry);
    if (!started.ok()) {
      Say(std::string(started.status().message()));
      return absl::IsInvalidArgument(started.status()) ? exit_code::kUsage
                                                       : exit_code::kUnavailable;
    }
    metrics_endpoint = *std::move(started);
  }
  // The server last: its health service says SERVING at once, and a readiness probe that
  // passes means /metrics answers too.
  auto server = CoordinatorServer::Start(coordinator->get(), server_options);
  if (!server.ok()) {
    Say(std::string(server.status().message()));
    return absl::IsInvalidArgument(server.status()) ? exit_code::kUsage : exit_code::kUnavailable;
  }
  const std::string listening =
      pipetrain::JoinHostPort(pipetrain::HostOf(server_options.listen), (*server)->port());
  std::fprintf(stderr, "pipetrain-coordinator: listening on %s (jobs in %s; %s, %s)\n",
               listening.c_str(), options.db_path.c_str(),
               !security.worker_token.empty() ? "user and worker tokens required"
               : security.token.empty()       ? "no token"
                                              : "token required",
               security.tls_ca.empty() ? (security.tls() ? "TLS" : "plaintext") : "mutual TLS");
  if (!port_file.empty()) {
    std::string address = absl::StrCat(listening, "\n");
    if (metrics_endpoint) {
      absl::StrAppend(&address, "metrics ", metrics_endpoint->address(), "\n");
    }
    if (absl::Status s = pipetrain::WriteFileAtomically(port_file, address); !s.ok()) {
      Say(absl::StrCat("--port-file: ", s.message()));
      return exit_code::kUnavailable;
    }
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "pipetrain-coordinator: stopping (signal %d)\n", sig);
  // Jobs that may restart get a checkpoint first, so the next start resumes them from here
  // (at most 30 s; jobs without restarts left wait for nothing).
  if (const int saved = (*coordinator)->jobs().CheckpointRunningJobs(absl::Seconds(30));
      saved > 0) {
    std::fprintf(stderr, "pipetrain-coordinator: %d running job%s checkpointed\n", saved,
                 saved == 1 ? "" : "s");
  }
  (*coordinator)->StopMonitor();
  (*server)->Shutdown();
  metrics_endpoint.reset();  // its scrapes read the coordinator
  server->reset();
  coordinator->reset();
  return exit_code::kOk;
}
