// A worker's FetchLayerState on its own, in a process of its own, for the memory test
// (held_state_memory_test.cc): a WorkerService on 127.0.0.1 (bound as the worker binds it)
// serving a HeldStates, and the worker's allocator settings. Driven by lines on stdin, each
// answered by one line on stdout:
//   hold BYTES KEY   holds one layer (layer 0 of job-1 at step 5) of BYTES random bytes
//   release          lets go of every hold (as a heartbeat's answer naming no job does)
//   grow MB          allocates MB MiB, touches it and keeps it (the test's negative control)
//   rss              this process's resident bytes now
// Every answer is "ok rss=N in_flight=K" (K: fetches being served). It prints "port P" first.
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "rpc/listen.h"
#include "runtime/base/allocator.h"
#include "runtime/base/clock.h"
#include "runtime/base/process_memory.h"
#include "worker/held_state.h"
#include "worker/worker_service.h"

int main() {
  using namespace pipetrain;
  TuneAllocatorForTraining();
  worker::HeldStates held(std::make_shared<RealClock>());
  worker::WorkerServiceAdapter service(nullptr, "command-key", &held);
  grpc::ServerBuilder builder;
  int port = 0;
  rpc::ListenExclusively(builder, "127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return 1;
  std::printf("port %d\n", port);
  std::fflush(stdout);
  std::vector<std::unique_ptr<char[]>> kept;
  std::string command;
  while (std::cin >> command) {
    if (command == "hold") {
      int64_t bytes = 0;
      std::string key;
      std::cin >> bytes >> key;
      std::string layer(static_cast<size_t>(bytes), '\0');
      std::mt19937_64 random(42);
      for (char& c : layer) c = static_cast<char>(random());
      held.Hold("job-1", 5, key, absl::Minutes(10), {{0, std::move(layer)}});
    } else if (command == "release") {
      held.KeepOnly({}, absl::Now() + absl::Seconds(1));
    } else if (command == "grow") {
      int mb = 0;
      std::cin >> mb;
      const size_t n = static_cast<size_t>(mb) << 20;
      kept.emplace_back(new char[n]);
      for (size_t i = 0; i < n; i += 4096) kept.back()[i] = 1;
    }
    std::printf("ok rss=%lld in_flight=%d\n", static_cast<long long>(ResidentMemoryBytes()),
                service.fetches_in_flight());
    std::fflush(stdout);
  }
  server->Shutdown();
  return 0;
}
