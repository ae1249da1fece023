// pipetrain-worker: one per GPU (or CPU slot). Registers with the coordinator and runs the
// pipeline stages it is assigned.
//
//   pipetrain-worker [--coordinator 127.0.0.1:7070] [--listen 127.0.0.1:0] [--device cpu]
//                    [--advertise-address ADDR | --iface NAME] [--metrics-listen 127.0.0.1:0]
//                    [--token-file PATH] [--tls-cert PEM --tls-key PEM [--tls-ca PEM]]
//
// SIGTERM or SIGINT: stops a running stage (reported to the coordinator) and exits 0.
// The token (--token-file, else $PIPETRAIN_TOKEN) is sent to the coordinator and asked of
// its calls; see rpc/security.h. Exit codes (runtime/base/exit_codes.h): 0 drained, 2 bad
// usage (an unreadable token or TLS file, a wildcard --listen with no address to advertise,
// or an address the coordinator refuses), 4 the coordinator refused its token, 5 cannot
// serve or register.
#include <csignal>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "rpc/protobuf_logs.h"
#include "runtime/base/allocator.h"
#include "runtime/base/atomic_file.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/printable.h"
#include "runtime/base/regular_file.h"
#include "runtime/job/device.h"
#include "runtime/memory/tensor_memory.h"
#include "worker/advertised_address.h"
#include "worker/data_roots.h"
#include "worker/worker.h"

namespace {

// One line on stderr, "pipetrain-worker: TEXT", TEXT escaped (it may hold what a flag said).
void Say(const std::string& text) {
  std::fprintf(stderr, "pipetrain-worker: %s\n", pipetrain::Printable(text).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // absl's lock-order checking (on in this build of absl) is a debugging aid: it records
  // every Mutex gRPC and the daemon take, a tenth of a busy coordinator's CPU. Off in the
  // daemons; the tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  using namespace pipetrain::worker;
  pipetrain::TuneAllocatorForTraining();
  pipetrain::memory::CountTensorMemory();  // step reports' peak_tensor_bytes
  namespace exit_code = pipetrain::exit_code;
  pipetrain::rpc::QuietMalformedRequestLogs();
  CLI::App app{
      "pipetrain-worker: runs the pipeline stages the coordinator assigns to this "
      "device, over the Gloo data plane, and reports every step."};
  WorkerOptions options;
  double register_timeout_s = 30;
  app.add_option("--coordinator", options.coordinator, "host:port of the coordinator")
      ->capture_default_str();
  std::string port_file;
  app.add_option("--port-file", port_file,
                 "once registered, write the host:port it serves on to this file, and a second "
                 "line 'metrics HOST:PORT' (written whole or not at all: read it to find a "
                 "worker started with port 0)");
  app.add_option("--metrics-listen", options.metrics_listen,
                 "host:port of its Prometheus endpoint, GET /metrics (port 0: any free port; "
                 "\"\": none)")
      ->capture_default_str();
  app.add_option("--listen", options.listen,
                 "host:port of this worker's service (port 0: any free port); a loopback "
                 "host with an address advertised elsewhere (--advertise-address, --iface) "
                 "listens on that address instead")
      ->capture_default_str();
  app.add_option("--device", options.device,
                 "the device it runs stages on: cpu, cuda (GPU 0) or cuda:N; it takes only jobs "
                 "of that device")
      ->capture_default_str();
  app.add_option("--advertise-address,--data-host", options.advertise_address,
                 "the address the coordinator and its peers reach this worker at, without a "
                 "port: its WorkerService is registered there (on the port --listen bound) and "
                 "its stages listen there for their peers (default: the host of --listen, or "
                 "the address of --iface; required when --listen is a wildcard such as "
                 "0.0.0.0; --data-host is its former name)");
  app.add_option("--iface", options.iface,
                 "the network interface its peers reach it on: its IPv4 address is advertised "
                 "when --advertise-address is not given, and NCCL uses it (NCCL_SOCKET_IFNAME, "
                 "unless set)");
  options.host = DefaultHostName();
  app.add_option("--host-name", options.host,
                 "the machine this worker runs on, as registered with the coordinator (workers "
                 "of one host share its links); under Slurm the node's name ($SLURMD_NODENAME), "
                 "else the hostname")
      ->capture_default_str();
  app.add_option("--data-root", options.data_roots,
                 "a directory jobs may read their files from (data.path, model.path) and write "
                 "to or resume from (checkpoint.dir, weights_dir, resume_from; also this "
                 "worker's checkpoints/); repeatable; symlinks are resolved and every file is "
                 "checked as opened, only regular files are read (default: none: a job may "
                 "name no data or model file, and writes and resumes only under this worker's "
                 "checkpoints/)");
  app.add_option("--register-timeout", register_timeout_s,
                 "seconds to keep trying to reach the coordinator at start")
      ->capture_default_str();
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file holding the coordinator's token: sent with every call to it and asked "
                 "of its calls (default: $PIPETRAIN_TOKEN; none: no token)");
  app.add_option("--tls-cert", options.security.tls_cert,
                 "PEM certificate: serve TLS and present it to the coordinator");
  app.add_option("--tls-key", options.security.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", options.security.tls_ca,
                 "PEM CA: verify the coordinator against it and require its client "
                 "certificate (mutual TLS)");
  CLI11_PARSE(app, argc, argv);
  // Before any job runs: every file this process reads for a job is checked, as opened,
  // against these (runtime/base/regular_file.h).
  pipetrain::SetReadRoots(pipetrain::worker::WritableRoots(options.data_roots));
  auto token = pipetrain::rpc::LoadToken(token_file);
  if (!token.ok()) {
    Say(std::string(token.status().message()));
    return exit_code::kUsage;
  }
  options.security.token = *std::move(token);
  // Where it will listen (a loopback --listen moves to the advertised address).
  absl::StatusOr<AdvertisedAddress> advertised =
      ChooseAdvertisedAddress(options.listen, options.advertise_address, options.iface);
  const std::string listen =
      advertised.ok() ? ListenAddressFor(options.listen, *advertised) : options.listen;
  if (const std::string warning = pipetrain::rpc::ListenWarning(listen, options.security);
      !warning.empty()) {
    Say(warning);
  }
  if (const std::string why = pipetrain::job::CheckDeviceVisible(options.device); !why.empty()) {
    Say(why);
    return exit_code::kUsage;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto worker = Worker::Start(options, absl::Seconds(register_timeout_s));
  if (!worker.ok()) {
    Say(std::string(worker.status().message()));
    // Start fails with InvalidArgument (2), Unauthenticated (4) or Unavailable (5).
    return exit_code::For(worker.status());
  }
  if (!port_file.empty()) {
    std::string lines = (*worker)->address() + "\n";
    if (!(*worker)->metrics_address().empty()) {
      lines += "metrics " + (*worker)->metrics_address() + "\n";
    }
    if (absl::Status s = pipetrain::WriteFileAtomically(port_file, lines); !s.ok()) {
      Say(absl::StrCat("--port-file: ", s.message()));
      (*worker)->Stop();
      return exit_code::kUnavailable;
    }
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "pipetrain-worker: draining (signal %d)\n", sig);
  (*worker)->Stop();
  return exit_code::kOk;
}
