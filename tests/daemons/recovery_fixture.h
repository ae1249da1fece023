// The fixture of the automatic-recovery tests (one binary, recovery_test): the job they run
// (float64, slow enough to be hit mid-step) with its recovery policy, polling a job until a
// condition, the steps the coordinator committed read from its SQLite file, the final
// weights gathered from weights_dir, and the same job run without daemons and without faults
// to compare them with. Helpers fail the calling test on what they cannot read; they run on
// the calling thread and own nothing beyond the files they write in the test's directory.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "pipetrain/v1/job_service.grpc.pb.h"
#include "tests/daemons/committed_steps.h"
#include "tests/daemons/local_cluster.h"

namespace pipetrain::test::recovery_test {

namespace fs = std::filesystem;
namespace v1 = ::pipetrain::v1;
using ::pipetrain::test::GetJob;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::pipetrain::test::Result;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class RecoveryTest : public ::pipetrain::test::DaemonTest {};

// p = 2, w = 2, float64: slow enough (a few hundred steps, several seconds) to be hit
// mid-step, with a checkpoint every `every` steps.
// The job without its checkpoint policy and max_restarts (see WithRecovery).
inline std::string Job(int steps, const std::string& schedule = "1f1b") {
  return "model: {name: gpt, d_model: 32, n_heads: 4, n_layers: 2}\n"
         "schedule: " +
         schedule +
         "\nstages: 2\nreplicas: 2\nmicrobatches: 4\n"
         "microbatch_size: 4\nsteps: " +
         std::to_string(steps) +
         "\ndtype: float64\n"
         "optimizer: {name: adamw, lr: 0.003}\ntimeout_s: 30\n";
}

// `job` with a checkpoint every `every` steps (keeping 2) and `max_restarts`.
inline std::string WithRecovery(const std::string& job, const fs::path& checkpoints, int every,
                                int max_restarts) {
  return job + "checkpoint: {dir: " + checkpoints.string() + ", every: " + std::to_string(every) +
         ", keep: 2}\nmax_restarts: " + std::to_string(max_restarts) + "\n";
}

// The number (start order) of the worker registered as `worker_id` (its log says so);
// -1 if none.
inline int WorkerIndex(LocalCluster& cluster, const std::string& worker_id) {
  for (int i = 0; i < cluster.workers_started(); ++i) {
    if (ReadFile(cluster.worker_log(i)).find("registered as " + worker_id + " ") !=
        std::string::npos) {
      return i;
    }
  }
  return -1;
}

// The job's record once `done` says so, or when `timeout` has passed.
inline v1::Job PollJob(v1::JobService::Stub& stub, const std::string& id,
                       const std::function<bool(const v1::Job&)>& done, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  v1::Job job;
  while (Clock::now() < deadline) {
    job = GetJob(stub, id);
    if (done(job)) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return job;
}

// Succeeded, failed or cancelled.
inline bool Ended(const v1::Job& job) {
  return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
         job.state() == v1::JOB_STATE_CANCELLED;
}

// Parameters then buffers of replica 0's stages (ranks 0..stages-1) from weights_dir.
inline std::vector<at::Tensor> GatherWeights(const fs::path& dir, int stages) {
  // Each model stage's tensors (a rank may hold several: stage<RANK>.json names them).
  std::map<int, std::vector<at::Tensor>> params, buffers;
  for (int rank = 0; rank < stages; ++rank) {
    std::vector<at::Tensor> held;
    torch::load(held, (dir / ("stage" + std::to_string(rank) + ".pt")).string());
    const auto meta =
        nlohmann::json::parse(ReadFile(dir / ("stage" + std::to_string(rank) + ".json")));
    const size_t n = meta.at("num_parameters");
    size_t next_parameter = 0, next_buffer = n;
    const auto& model_stages = meta.at("model_stages");
    for (size_t k = 0; k < model_stages.size(); ++k) {
      const int stage = model_stages[k];
      const size_t p = meta.at("parameter_counts")[k], b = meta.at("buffer_counts")[k];
      params[stage].assign(held.begin() + next_parameter, held.begin() + next_parameter + p);
      buffers[stage].assign(held.begin() + next_buffer, held.begin() + next_buffer + b);
      next_parameter += p;
      next_buffer += b;
    }
  }
  std::vector<at::Tensor> all;
  for (const auto& [stage, tensors] : params) all.insert(all.end(), tensors.begin(), tensors.end());
  for (const auto& [stage, tensors] : buffers)
    all.insert(all.end(), tensors.begin(), tensors.end());
  return all;
}

// The same job run without daemons and without faults (stages as threads).
inline std::vector<at::Tensor> Uninterrupted(LocalCluster& cluster, const fs::path& dir,
                                             const std::string& spec) {
  std::ofstream(dir / "reference.yaml") << spec;
  Result ran = cluster.Shell(std::string(LocalCluster::cli_path()) + " run --launch threads " +
                             (dir / "reference.yaml").string() + " -q --save-weights " +
                             (dir / "reference.pt").string());
  EXPECT_EQ(ran.exit_code, 0) << ran.err;
  std::vector<at::Tensor> expected;
  torch::load(expected, (dir / "reference.pt").string());
  return expected;
}

// Each tensor of `got` within `tolerance` of `expected`'s, relative to its norm.
inline void ExpectWithin(const std::vector<at::Tensor>& got,
                         const std::vector<at::Tensor>& expected, double tolerance) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), expected[i].sizes()) << i;
    const double denom = std::max(expected[i].norm().item<double>(), 1e-30);
    EXPECT_LE((got[i] - expected[i]).norm().item<double>() / denom, tolerance) << "tensor " << i;
  }
}

// Submits the job in `spec` to a fresh cluster; its id (the first job's).
inline std::string Submit(LocalCluster& cluster, const fs::path& spec) {
  Result submitted = cluster.Cli("submit " + spec.string());
  EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
  return "job-0001";
}

}  // namespace pipetrain::test::recovery_test
