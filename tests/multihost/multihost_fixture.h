// The multi-host tests' fixture: hosts as network namespaces (namespace_hosts.h), a
// coordinator on host 0, workers started on the others, the CLI run on the coordinator's
// host, job files of a small float64 GPT, and the un-pipelined reference to compare with.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "jobspec/spec_yaml.h"
#include "runtime/base/subprocess.h"
#include "runtime/job/job_spec.h"
#include "runtime/job/reference/reference_trainer.h"
#include "tests/multihost/namespace_hosts.h"

namespace pipetrain::test {

namespace fs = std::filesystem;

constexpr int kCoordinatorHost = 0;
constexpr int kWorkerHosts = 4;     // hosts 1..4
constexpr int kWorkersPerHost = 2;  // worker 0 by --iface, worker 1 by --advertise-address

class MultihostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<NamespaceHosts>> hosts =
        NamespaceHosts::Create(1 + kWorkerHosts + 1);  // and one for the management network
    if (!hosts.ok()) GTEST_SKIP() << "no hosts as network namespaces: " << hosts.status();
    hosts_ = *std::move(hosts);
    dir_ = fs::temp_directory_path() /
           absl::StrCat("pipetrain-multihost-", getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    hosts_.reset();  // every process, then every namespace
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string Coordinator() const { return hosts_->DataAddress(kCoordinatorHost) + ":7070"; }
  // The coordinator on host 0, on every address of it (the data and management networks),
  // with `flags` besides.
  void StartCoordinator(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> argv = {
        PIPETRAIN_COORDINATOR, "--listen", "0.0.0.0:7070",     "--db", (dir_ / "jobs.db").string(),
        "--heartbeat-ms",      "500",      "--metrics-listen", ""};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ASSERT_TRUE(hosts_->Start(kCoordinatorHost, argv, dir_ / "coordinator.log").ok());
  }
  pid_t StartWorker(int host, const std::vector<std::string>& address_flags,
                    const std::string& coordinator, const std::string& name) {
    // Named after its host, as a worker on a machine of its own would be by its hostname;
    // its jobs write their weights and checkpoints under the test's directory.
    std::vector<std::string> argv = {PIPETRAIN_WORKER,
                                     "--coordinator",
                                     coordinator,
                                     "--metrics-listen",
                                     "",
                                     "--register-timeout",
                                     "30",
                                     "--host-name",
                                     "host" + std::to_string(host),
                                     "--data-root",
                                     dir_.string()};
    argv.insert(argv.end(), address_flags.begin(), address_flags.end());
    absl::StatusOr<pid_t> pid = hosts_->Start(host, argv, dir_ / (name + ".log"));
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : -1;
  }
  // `pipetrain ARGS --coordinator C` on the coordinator's host.
  NamespaceHosts::Ran Cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {PIPETRAIN_CLI};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--coordinator");
    argv.push_back(Coordinator());
    return hosts_->Run(kCoordinatorHost, argv);
  }
  std::vector<nlohmann::json> Workers() {
    std::vector<nlohmann::json> out;
    for (absl::string_view line : absl::StrSplit(Cli({"workers", "-o", "json"}).out, '\n')) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line, nullptr, false));
    }
    return out;
  }
  bool WaitForIdleWorkers(size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      size_t idle = 0;
      for (const nlohmann::json& w : Workers()) idle += w.value("state", "") == "WORKER_STATE_IDLE";
      if (idle >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  }
  // The job file: a small GPT in float64, `stages` x `replicas`, its weights saved.
  // `extra`: more YAML lines (a checkpoint policy, max_restarts).
  fs::path WriteJob(const std::string& name, int stages, int replicas, int steps,
                    int timeout_s = 60, const std::string& extra = "") {
    const fs::path file = dir_ / (name + ".yaml");
    std::ofstream(file) << "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\n"
                        << "data: {kind: synthetic, seq_len: 8, vocab: 16, num_tokens: 4096}\n"
                        << "schedule: 1f1b\nstages: " << stages << "\nreplicas: " << replicas
                        << "\nmicrobatches: 4\nmicrobatch_size: 2\nsteps: " << steps
                        << "\ndtype: float64\nthreads_per_stage: 1\ntimeout_s: " << timeout_s
                        << "\nweights_dir: " << (dir_ / (name + "-weights")).string() << "\n"
                        << extra;
    return file;
  }
  // Job `id` as `pipetrain list -o json` shows it (null when it is not listed).
  nlohmann::json JobJson(const std::string& id) {
    for (absl::string_view line : absl::StrSplit(Cli({"list", "-o", "json"}).out, '\n')) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.value("id", "") == id) return j;
    }
    return nullptr;
  }
  // Polls job `id` until `done` holds (or `seconds` pass); the last record seen.
  template <typename Done>
  nlohmann::json WaitForJob(const std::string& id, Done done, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    nlohmann::json job;
    while (std::chrono::steady_clock::now() < deadline) {
      job = JobJson(id);
      if (!job.is_null() && done(job)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return job;
  }
  std::string Slurp(const fs::path& file) {
    std::ifstream in(file);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::unique_ptr<NamespaceHosts> hosts_;
  fs::path dir_;
};

// Replica 0's parameters, rank by rank, as the workers saved them (stage<R>.pt holds the
// parameters, then the buffers; stage<R>.json how many parameters).
inline std::vector<at::Tensor> SavedParameters(const fs::path& dir, int stages) {
  std::vector<at::Tensor> params;
  for (int rank = 0; rank < stages; ++rank) {
    std::vector<at::Tensor> stage;
    torch::load(stage, (dir / absl::StrCat("stage", rank, ".pt")).string());
    std::ifstream meta(dir / absl::StrCat("stage", rank, ".json"));
    const size_t n = nlohmann::json::parse(meta).at("num_parameters");
    params.insert(params.end(), stage.begin(), stage.begin() + n);
  }
  return params;
}

// An integer field of a message as JSON: int64 fields are strings there, and a field at its
// default (0) is left out.
inline int64_t IntField(const nlohmann::json& j, const std::string& key) {
  if (!j.is_object() || !j.contains(key)) return 0;
  const nlohmann::json& v = j.at(key);
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

// How far the parameters replica 0 saved in `weights` are from the un-pipelined reference
// trained on `job_file`'s job (max over tensors of ||got - reference|| / ||reference||).
inline double DifferenceFromReference(const fs::path& job_file, const fs::path& weights,
                                      int stages) {
  std::ifstream in(job_file);
  const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<v1::JobSpec> spec = jobspec::JobSpecFromYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return 1;
  absl::StatusOr<job::JobSpec> config = job::Validated(*spec);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return 1;
  config->clear_weights_dir();
  config->mutable_checkpoint()->set_every(0);
  absl::StatusOr<std::vector<at::Tensor>> reference = job::TrainReference(*config);
  EXPECT_TRUE(reference.ok()) << reference.status();
  if (!reference.ok()) return 1;
  return job::MaxRelativeDifference(SavedParameters(weights, stages), *reference);
}

}  // namespace pipetrain::test
