// pipetrain-worker: one per GPU (or CPU slot). Registers with the coordinator and runs the
// pipeline stages it is assigned.
//
//   pipetrain-worker [--coordinator 127.0.0.1:7070] [--listen 127.0.0.1:0] [--device cpu]
//
// SIGTERM or SIGINT: stops a running stage (reported to the coordinator) and exits 0.
#include <csignal>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "worker/worker.h"

int main(int argc, char** argv) {
  using namespace pipetrain::worker;
  CLI::App app{"pipetrain-worker: runs the pipeline stages the coordinator assigns to this "
               "device, over the Gloo data plane, and reports every step."};
  WorkerOptions options;
  double register_timeout_s = 30;
  app.add_option("--coordinator", options.coordinator, "host:port of the coordinator")
      ->capture_default_str();
  app.add_option("--listen", options.listen,
                 "host:port of this worker's service (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--device", options.device, "the device it runs stages on")
      ->capture_default_str();
  app.add_option("--data-host", options.data_host,
                 "address its stages listen on for their peers")
      ->capture_default_str();
  app.add_option("--register-timeout", register_timeout_s,
                 "seconds to keep trying to reach the coordinator at start")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (options.device != "cpu") {
    std::fprintf(stderr, "pipetrain-worker: --device %s: only cpu stages run in this build\n",
                 options.device.c_str());
    return 2;
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto worker = Worker::Start(options, absl::Seconds(register_timeout_s));
  if (!worker.ok()) {
    std::fprintf(stderr, "pipetrain-worker: %s\n", std::string(worker.status().message()).c_str());
    return 5;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "pipetrain-worker: draining (signal %d)\n", sig);
  (*worker)->Stop();
  return 0;
}
