// A worker's memory does not grow with the number of steps it runs: a real worker daemon
// trains a tiny model for 10^6 steps under a real coordinator, and its resident-memory
// high-water mark after the last step is within 10 MB of the one after step 10^3. What
// grew with steps before (the whole action list, every action's record, step reports
// queued faster than they were sent) is now generated, kept as a window, or paced.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "pipetrain/v1/job_service.grpc.pb.h"
#include "tests/daemons/local_cluster.h"

namespace {

namespace v1 = ::pipetrain::v1;
using ::pipetrain::test::DaemonTest;
using ::pipetrain::test::GetJob;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::Result;
using Clock = std::chrono::steady_clock;

constexpr int64_t kSteps = 1000000;

// A one-rank job whose step costs tens of microseconds: what is measured is the per-step
// bookkeeping of the executor, the worker and its reports, not the model.
constexpr char kTinyJob[] = R"(name: a million tiny steps
model: {name: mlp, hidden: 4, hidden_layers: 1, input_dim: 4, num_classes: 2}
data: {num_samples: 64}
optimizer: {name: sgd, lr: 0.01}
schedule: 1f1b
stages: 1
microbatches: 1
microbatch_size: 1
threads_per_stage: 1
steps: 1000000
)";

// "VmHWM" (peak resident) or "VmRSS" of a process, in bytes; -1 if unreadable.
int64_t ProcStatusBytes(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

class WorkerMemoryTest : public DaemonTest {};

TEST_F(WorkerMemoryTest, AMillionStepsWithinTenMegabytesOfAThousand) {
  LocalCluster cluster(dir_, 1);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1));
  Result submitted = cluster.Cli("submit " + Write("tiny.yaml", kTinyJob).string());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = submitted.out.substr(0, submitted.out.find_first_of(" \n"));
  std::unique_ptr<v1::JobService::Stub> stub = cluster.JobStub();
  const pid_t worker = cluster.worker_pid(0);

  // After step 10^3 (the worker has built its stage and settled), and after 10^5 (every
  // kept window is full by then: from there on nothing may grow at all).
  const auto start = Clock::now();
  auto peak_after = [&](int64_t step, int64_t* seen) -> int64_t {
    while (Clock::now() - start < std::chrono::seconds(120)) {
      const v1::Job job = GetJob(*stub, id);
      if (job.step() >= step) {
        *seen = job.step();
        return ProcStatusBytes(worker, "VmHWM");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  };
  int64_t early_step = -1, middle_step = -1;
  const int64_t early_peak = peak_after(1000, &early_step);
  ASSERT_GT(early_peak, 0) << "the job did not reach step 1000";
  const int64_t middle_peak = peak_after(100000, &middle_step);
  ASSERT_GT(middle_peak, 0) << "the job did not reach step 100000";

  // About 210-245 s on a quiet machine of two cores; the deadline leaves room for a slow one.
  v1::Job job;
  while (Clock::now() - start < std::chrono::seconds(400)) {
    job = GetJob(*stub, id);
    if (job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.message();
  EXPECT_EQ(job.step(), kSteps - 1);
  const int64_t final_peak = ProcStatusBytes(worker, "VmHWM");
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "worker peak resident memory: %.1f MB after step %lld, %.1f MB after step %lld, "
      "%.1f MB after %lld steps (%.0f s)\n",
      early_peak / 1e6, static_cast<long long>(early_step), middle_peak / 1e6,
      static_cast<long long>(middle_step), final_peak / 1e6, static_cast<long long>(kSteps),
      seconds);
  RecordProperty("early_peak_bytes", std::to_string(early_peak));
  RecordProperty("middle_peak_bytes", std::to_string(middle_peak));
  RecordProperty("final_peak_bytes", std::to_string(final_peak));
  EXPECT_LT(final_peak - early_peak, 10'000'000)
      << "the worker's memory grew by " << (final_peak - early_peak) / 1e6 << " MB";
  EXPECT_LT(final_peak - middle_peak, 2'000'000)
      << "the worker's memory grew by " << (final_peak - middle_peak) / 1e6
      << " MB over the last 900,000 steps";
  // The worker is still there and takes the next job.
  EXPECT_TRUE(cluster.WaitForIdleWorkers(1));
}

}  // namespace
