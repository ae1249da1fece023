// A flood of FetchLayerState calls without a key (or with a wrong one) at one worker, for
// bench/fetch_flood.py: THREADS threads, each calling as fast as it can for SECONDS, each
// call on a fresh context (the worker refuses them all: PERMISSION_DENIED). Prints one line:
// "calls N in S s (R/s), answers: PERMISSION_DENIED n, other m".
//   fetch_flood HOST:PORT SECONDS [THREADS=8] [KEY=""]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "pipetrain/v1/worker_service.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fetch_flood HOST:PORT SECONDS [THREADS] [KEY]\n");
    return 2;
  }
  const std::string address = argv[1];
  const double seconds = std::atof(argv[2]);
  const int threads = argc > 3 ? std::atoi(argv[3]) : 8;
  const std::string key = argc > 4 ? argv[4] : "";
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = pipetrain::v1::WorkerService::NewStub(channel);
  std::atomic<int64_t> calls{0}, denied{0}, other{0};
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  std::vector<std::thread> flooders;
  for (int t = 0; t < threads; ++t) {
    flooders.emplace_back([&] {
      pipetrain::v1::FetchLayerStateRequest request;
      request.set_job_id("job-0001");
      request.set_step(1);
      request.set_layer(0);
      request.set_state_key(key);
      while (std::chrono::steady_clock::now() < end) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        auto reader = stub->FetchLayerState(&ctx, request);
        pipetrain::v1::LayerStateChunk chunk;
        while (reader->Read(&chunk)) {
        }
        const grpc::Status s = reader->Finish();
        ++calls;
        ++(s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? denied : other);
      }
    });
  }
  for (std::thread& t : flooders) t.join();
  std::printf("calls %lld in %.1f s (%.0f/s), answers: PERMISSION_DENIED %lld, other %lld\n",
              static_cast<long long>(calls.load()), seconds, calls.load() / seconds,
              static_cast<long long>(denied.load()), static_cast<long long>(other.load()));
  return 0;
}
