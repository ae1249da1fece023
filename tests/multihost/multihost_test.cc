// The whole system on several hosts with addresses of their own (network namespaces,
// namespace_hosts.h): a coordinator on host 0 and two workers on each of hosts 1..4, which
// advertise their data-network address (one by --iface, one by --advertise-address). Jobs of
// 2 stages x 2 replicas and 4 stages x 2 replicas across the hosts end with the parameters of
// the un-pipelined reference in float64, and their activations, gradients and AllReduces
// cross the veth links (counted on the hosts' eth0: the topology-aware placement keeps the
// first job's pipelines within hosts, so its AllReduces cross, and the second's stages, so
// its activations do). A worker that advertises a loopback
// address to a coordinator on another host is refused and exits 2 at once; one that
// advertises an address its peers cannot reach fails its job within timeout_s, naming the
// peer and the address. Root only: elsewhere the tests skip, saying why.
#include "tests/multihost/multihost_fixture.h"

#include "runtime/model/model_config.h"

namespace pipetrain::test {
namespace {

using ::testing::HasSubstr;

// One version of each stage's parameters in float64 (stage_status: replica 0's stages first,
// each with the layers it built), by the job's model's formulas.
std::vector<int64_t> StageParameterBytes(const fs::path& job_file, const nlohmann::json& stages) {
  std::ifstream in(job_file);
  const std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<job::JobSpec> config = job::Validated(*jobspec::JobSpecFromYaml(yaml));
  model::ModelConfig m = job::ModelConfigOf(*config);
  m.vocab_size = config->data().vocab();
  m.seq_len = config->data().seq_len();
  const std::vector<model::LayerInfo> layers = *model::BuiltinLayers(m);
  std::vector<int64_t> out;
  for (const nlohmann::json& st : stages) {
    int64_t count = 0;
    for (int l = st.value("layers_begin", 0); l < st.value("layers_end", 0); ++l) {
      count += layers[l].num_parameters;
    }
    out.push_back(8 * count);
  }
  return out;
}

TEST_F(MultihostTest, JobsAcrossHostsEqualTheReferenceAndCrossTheLinks) {
  StartCoordinator();
  for (int host = 1; host <= kWorkerHosts; ++host) {
    // --iface alone: its service listens on eth0's address (not the default loopback).
    StartWorker(host, {"--iface", "eth0"}, Coordinator(), absl::StrCat("worker-h", host, "-iface"));
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
    EXPECT_EQ(w.value("host", ""), absl::StrCat("host", host)) << "its --host-name";
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
    const double difference = DifferenceFromReference(job, dir_ / (name + "-weights"), stages);
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
    int64_t least = int64_t{crossing} * steps * 4 * 2 * tensor_bytes;
    // A stage whose two replicas are on two hosts averages its gradient across them: each
    // step, each of the two sends the other at least half of it (a ring of two).
    const std::vector<int64_t> stage_bytes = StageParameterBytes(job, placed.at("stage_status"));
    int replica_groups_crossing = 0;
    for (int s = 0; s < stages; ++s) {
      if (rank_host[s] == rank_host[stages + s]) continue;
      ++replica_groups_crossing;
      least += int64_t{steps} * stage_bytes[s];
    }
    std::printf(
        "%d stages x 2 replicas: parameters within %.2g of the reference; %d pipeline "
        "links and %d AllReduce pairs between hosts; eth0 sent %lld bytes (at least "
        "%lld for the activations, gradients and AllReduces crossing)\n",
        stages, difference, crossing, replica_groups_crossing,
        static_cast<long long>(sent_on_links), static_cast<long long>(least));
    EXPECT_GT(crossing + replica_groups_crossing, 0) << "one host for all: nothing would cross";
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
  EXPECT_THAT(
      Slurp(dir_ / "loopback-worker.log"),
      HasSubstr("is a loopback address, but the worker registered from " + hosts_->DataAddress(1)));
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
