// The whole system on several hosts with addresses of their own (network namespaces,
// namespace_hosts.h): a coordinator on host 0 and two workers on each of hosts 1..4, which
// advertise their data-network address (one by --iface, one by --advertise-address). Jobs of
// 2 stages x 2 replicas and 4 stages x 2 replicas across the hosts end with the parameters of
// the un-pipelined reference in float64, and their activations, gradients and AllReduces
// cross the veth links (counted on the hosts' eth0). A worker that advertises a loopback
// address to a coordinator on another host is refused and exits 2 at once; one that
// advertises an address its peers cannot reach fails its job within timeout_s, naming the
// peer and the address. Root only: elsewhere the tests skip, saying why.
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
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "jobspec/job_config_from_spec.h"
#include "jobspec/spec_yaml.h"
#include "runtime/base/subprocess.h"
#include "runtime/job/reference/reference_trainer.h"
#include "tests/multihost/namespace_hosts.h"

namespace pipetrain::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

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

  std::string Coordinator() const {
    return hosts_->DataAddress(kCoordinatorHost) + ":7070";
  }
  // The coordinator on host 0, on every address of it (the data and management networks).
  void StartCoordinator() {
    ASSERT_TRUE(hosts_->Start(kCoordinatorHost,
                              {PIPETRAIN_COORDINATOR, "--listen", "0.0.0.0:7070", "--db",
                               (dir_ / "jobs.db").string(), "--heartbeat-ms", "500",
                               "--metrics-listen", ""},
                              dir_ / "coordinator.log")
                    .ok());
  }
  pid_t StartWorker(int host, const std::vector<std::string>& address_flags,
                    const std::string& coordinator, const std::string& name) {
    std::vector<std::string> argv = {PIPETRAIN_WORKER, "--coordinator", coordinator,
                                     "--metrics-listen", "", "--register-timeout", "30"};
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
  fs::path WriteJob(const std::string& name, int stages, int replicas, int steps,
                    int timeout_s = 60) {
    const fs::path file = dir_ / (name + ".yaml");
    std::ofstream(file) << "model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2}\n"
                        << "data: {kind: synthetic, seq_len: 8, vocab: 16, num_tokens: 4096}\n"
                        << "schedule: 1f1b\nstages: " << stages << "\nreplicas: " << replicas
                        << "\nmicrobatches: 4\nmicrobatch_size: 2\nsteps: " << steps
                        << "\ndtype: float64\nthreads_per_stage: 1\ntimeout_s: " << timeout_s
                        << "\nweights_dir: " << (dir_ / (name + "-weights")).string() << "\n";
    return file;
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
std::vector<at::Tensor> SavedParameters(const fs::path& dir, int stages) {
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

TEST_F(MultihostTest, JobsAcrossHostsEqualTheReferenceAndCrossTheLinks) {
  StartCoordinator();
  for (int host = 1; host <= kWorkerHosts; ++host) {
    StartWorker(host, {"--listen", "0.0.0.0:0", "--iface", "eth0"}, Coordinator(),
                absl::StrCat("worker-h", host, "-iface"));
    StartWorker(host, {"--listen", "0.0.0.0:0", "--advertise-address", hosts_->DataAddress(host)},
                Coordinator(), absl::StrCat("worker-h", host, "-advertised"));
  }
  ASSERT_TRUE(WaitForIdleWorkers(kWorkerHosts * kWorkersPerHost))
      << Slurp(dir_ / "coordinator.log");
  // Every worker is registered at its host's data-network address; which host each one is on.
  std::map<std::string, int> host_of;  // worker id -> host
  for (const nlohmann::json& w : Workers()) {
    const std::string address = w.value("address", "");
    int host = -1;
    for (int h = 1; h <= kWorkerHosts; ++h) {
      if (address.rfind(hosts_->DataAddress(h) + ":", 0) == 0) host = h;
    }
    EXPECT_GE(host, 1) << "registered at " << address;
    host_of[w.value("id", "")] = host;
  }

  for (const int stages : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(stages, " stages x 2 replicas"));
    const std::string name = absl::StrCat("p", stages, "w2");
    const int steps = 6;
    const fs::path job = WriteJob(name, stages, 2, steps);
    std::map<int, int64_t> sent_before;
    for (int h = 1; h <= kWorkerHosts; ++h) sent_before[h] = hosts_->TxBytes(h, "eth0");
    const NamespaceHosts::Ran submitted = Cli({"submit", job.string(), "--follow"});
    ASSERT_EQ(submitted.exit_code, 0) << submitted.out << Slurp(dir_ / "coordinator.log");
    int64_t sent_on_links = 0;
    for (int h = 1; h <= kWorkerHosts; ++h) {
      sent_on_links += hosts_->TxBytes(h, "eth0") - sent_before[h];
    }

    // The parameters equal the un-pipelined reference's.
    absl::StatusOr<v1::JobSpec> spec = jobspec::JobSpecFromYaml(Slurp(job));
    ASSERT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<job::JobConfig> config = jobspec::JobConfigFromSpec(*spec);
    ASSERT_TRUE(config.ok()) << config.status();
    config->weights_dir.clear();
    absl::StatusOr<std::vector<at::Tensor>> reference = job::TrainReference(*config);
    ASSERT_TRUE(reference.ok()) << reference.status();
    const std::vector<at::Tensor> got = SavedParameters(dir_ / (name + "-weights"), stages);
    const double difference = job::MaxRelativeDifference(got, *reference);
    EXPECT_LE(difference, 1e-10);

    // What had to cross between hosts did: each pipeline link between two hosts carries
    // every micro-batch's activation one way and its gradient the other (b x seq x d_model
    // float64 each), so eth0 sent at least that much.
    const NamespaceHosts::Ran status = Cli({"list", "-o", "json"});
    nlohmann::json placed;
    for (absl::string_view line : absl::StrSplit(status.out, '\n')) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.value("stages", 0) == stages) placed = j;
    }
    ASSERT_TRUE(placed.contains("stage_status")) << status.out;
    std::vector<int> rank_host;
    for (const nlohmann::json& st : placed.at("stage_status")) {
      rank_host.push_back(host_of[st.value("worker_id", "")]);
    }
    int crossing = 0;
    for (int replica = 0; replica < 2; ++replica) {
      for (int s = 0; s + 1 < stages; ++s) {
        crossing += rank_host[replica * stages + s] != rank_host[replica * stages + s + 1];
      }
    }
    const int64_t tensor_bytes = int64_t{2} * 8 * 16 * 8;  // b x seq x d_model, float64
    const int64_t least = int64_t{crossing} * steps * 4 * 2 * tensor_bytes;
    int replica_groups_crossing = 0;  // a stage whose two replicas are on two hosts
    for (int s = 0; s < stages; ++s) {
      replica_groups_crossing += rank_host[s] != rank_host[stages + s];
    }
    std::printf("%d stages x 2 replicas: parameters within %.2g of the reference; %d pipeline "
                "links and %d AllReduce pairs between hosts; eth0 sent %lld bytes (at least "
                "%lld for the activations and gradients crossing)\n",
                stages, difference, crossing, replica_groups_crossing,
                static_cast<long long>(sent_on_links), static_cast<long long>(least));
    EXPECT_GT(crossing, 0) << "every pipeline on one host: nothing would cross";
    EXPECT_GE(sent_on_links, least);
  }
}

TEST_F(MultihostTest, ALoopbackAddressFromAnotherHostIsRefusedAtOnce) {
  StartCoordinator();
  const auto start = std::chrono::steady_clock::now();
  const pid_t worker =
      StartWorker(1, {"--listen", "127.0.0.1:0"}, Coordinator(), "loopback-worker");
  ASSERT_GT(worker, 0);
  const int status = subprocess::Wait(worker);
  const double waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(subprocess::ExitCode(status), 2);
  EXPECT_LT(waited_s, 10) << "refused at once, not after --register-timeout";
  EXPECT_THAT(Slurp(dir_ / "loopback-worker.log"),
              HasSubstr("is a loopback address, but the worker registered from " +
                        hosts_->DataAddress(1)));
  EXPECT_THAT(Slurp(dir_ / "loopback-worker.log"), HasSubstr("--advertise-address"));
}

// Host 5 is on the management network only (with the coordinator's host): its worker
// registers there and the coordinator reaches it, but the workers on the data network
// cannot. A job across it and host 1 fails within timeout_s, naming the peer and the address.
TEST_F(MultihostTest, AnAddressItsPeersCannotReachFailsTheJobNamingIt) {
  const int island = kWorkerHosts + 1;
  ASSERT_TRUE(hosts_->AddManagementNetwork({kCoordinatorHost, island}).ok());
  ASSERT_TRUE(hosts_->SetLink(island, "eth0", false).ok());  // off the data network
  StartCoordinator();
  StartWorker(1, {"--listen", "0.0.0.0:0", "--iface", "eth0"}, Coordinator(), "worker-h1");
  StartWorker(island, {"--listen", "0.0.0.0:0", "--iface", "eth1"},
              hosts_->ManagementAddress(kCoordinatorHost) + ":7070", "worker-island");
  ASSERT_TRUE(WaitForIdleWorkers(2)) << Slurp(dir_ / "coordinator.log");
  const int timeout_s = 10;
  const fs::path job = WriteJob("split", 2, 1, 4, timeout_s);
  const auto start = std::chrono::steady_clock::now();
  const NamespaceHosts::Ran submitted = Cli({"submit", job.string(), "--follow"});
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(submitted.exit_code, 0);
  EXPECT_LT(took_s, timeout_s + 10) << "failed within its deadline, not hung";
  const NamespaceHosts::Ran listed = Cli({"list", "-o", "json"});
  EXPECT_THAT(listed.out, HasSubstr("JOB_STATE_FAILED"));
  // Whichever rank saw it first names the other one and the address it could not reach.
  EXPECT_THAT(listed.out, HasSubstr("connecting the Gloo data plane within 10s failed"));
  EXPECT_THAT(listed.out, HasSubstr("it could not reach rank"));
  EXPECT_TRUE(listed.out.find(hosts_->ManagementAddress(island)) != std::string::npos ||
              listed.out.find(hosts_->DataAddress(1)) != std::string::npos)
      << listed.out;
}

}  // namespace
}  // namespace pipetrain::test
