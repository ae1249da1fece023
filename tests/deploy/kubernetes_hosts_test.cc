// deploy/kubernetes's cpu overlay with each pod on a host of its own, as a cluster runs it:
// every pod is a network namespace with its own address (tests/multihost/namespace_hosts.h),
// $(POD_IP) that address, and a Service's name the address of the host its pod runs on. The
// coordinator's and workers' exact command lines bind their container ports on their own
// hosts (the same ports on every worker host, as pods do), the workers register at their pod
// addresses with their nodes' names as hosts, and the submit Job's command line, on a host of
// its own, trains the ConfigMap's job to success across the hosts, the pipeline's traffic on
// the hosts' links. Root only (the namespaces), and kubectl (the rendering): skipped
// otherwise, saying why.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/daemon_process.h"
#include "tests/deploy/container_runner.h"
#include "tests/deploy/kubernetes_fixture.h"
#include "tests/multihost/namespace_hosts.h"

namespace pipetrain::kubernetes_test {
namespace {

using ::pipetrain::test::NamespaceHosts;

TEST_F(KubernetesTest, EachPodOnAHostOfItsOwnTrainsTheJobThroughItsServices) {
  const std::vector<YAML::Node> objects = Render("cpu");
  const YAML::Node* coordinator = Find(objects, "StatefulSet", "pipetrain-coordinator");
  const YAML::Node* workers = Find(objects, "StatefulSet", "pipetrain-worker");
  const YAML::Node* submit = Find(objects, "Job", "pipetrain-submit");
  ASSERT_TRUE(coordinator && workers && submit);
  const int replicas = (*workers)["spec"]["replicas"].as<int>();
  // Host 0: the coordinator's pod; 1..replicas: the workers' pods; the last: the submit Job's.
  const int submit_host = replicas + 1;
  absl::StatusOr<std::unique_ptr<NamespaceHosts>> made = NamespaceHosts::Create(replicas + 2);
  if (!made.ok()) GTEST_SKIP() << "no hosts as network namespaces here: " << made.status();
  NamespaceHosts& hosts = **made;

  ContainerRunner runner(objects, dir_);
  // Each Service resolves to the host of the pods it selects: here the coordinator's.
  const auto coordinator_labels =
      StringMap((*coordinator)["spec"]["template"]["metadata"]["labels"]);
  for (const YAML::Node& s : objects) {
    if (s["kind"].as<std::string>() == "Service" &&
        Subset(StringMap(s["spec"]["selector"]), coordinator_labels)) {
      runner.SetServiceHost(s["metadata"]["name"].as<std::string>(), hosts.DataAddress(0));
    }
  }
  const Launch c = runner.Prepare(*coordinator, hosts.DataAddress(0), "coordinator");
  ASSERT_TRUE(hosts.Start(0, c.argv, c.log).ok());
  const YAML::Node wc = (*workers)["spec"]["template"]["spec"]["containers"][0];
  const int worker_port = ContainerPort(wc, "grpc");
  for (int i = 0; i < replicas; ++i) {
    const Launch w =
        runner.Prepare(*workers, hosts.DataAddress(1 + i), "worker-" + std::to_string(i));
    ASSERT_TRUE(hosts.Start(1 + i, w.argv, w.log).ok());
  }

  // The submit Job's command line, resolved as on its host; the same coordinator address
  // lists the workers (a client on the submit Job's host, as a user's would be).
  const Launch s = runner.Prepare(*submit, hosts.DataAddress(submit_host), "submit");
  std::string coordinator_address, token_file;
  for (size_t k = 1; k < s.argv.size(); ++k) {
    if (s.argv[k].rfind("--coordinator=", 0) == 0) coordinator_address = s.argv[k].substr(14);
    if (s.argv[k].rfind("--token-file=", 0) == 0) token_file = s.argv[k].substr(13);
  }
  ASSERT_EQ(coordinator_address,
            absl::StrCat(hosts.DataAddress(0), ":",
                         ContainerPort((*coordinator)["spec"]["template"]["spec"]["containers"][0],
                                       "grpc")));
  // `pipetrain workers -o json`: a worker per line. Up to 60 s for every worker to register.
  std::vector<std::string> addresses;
  std::string listed;
  int idle = 0;
  for (int attempt = 0; attempt < 300 && idle < replicas; ++attempt) {
    const NamespaceHosts::Ran ran = hosts.Run(
        submit_host, {LocalCluster::cli_path(), "workers", "--coordinator", coordinator_address,
                      "--token-file", token_file, "-o", "json", "--timeout", "5"});
    idle = 0;
    addresses.clear();
    listed = ran.out;
    for (absl::string_view line : absl::StrSplit(ran.out, '\n', absl::SkipEmpty())) {
      const nlohmann::json w = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (w.is_object() && w.value("state", "") == "WORKER_STATE_IDLE") {
        ++idle;
        addresses.push_back(w.value("address", "") + " on " + w.value("host", ""));
      }
    }
    if (idle < replicas) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_EQ(idle, replicas) << listed << "\n" << pipetrain::client::LogTail(c.log);
  // Each worker registered at its own pod's address and the port its container declares, and
  // its node's name (the downward API's spec.nodeName) as its host.
  for (int i = 0; i < replicas; ++i) {
    EXPECT_THAT(addresses,
                ::testing::Contains(absl::StrCat(hosts.DataAddress(1 + i), ":", worker_port,
                                                 " on node-", hosts.DataAddress(1 + i))));
  }

  std::vector<int64_t> sent_before;
  for (int i = 0; i < replicas; ++i) sent_before.push_back(hosts.TxBytes(1 + i, "eth0"));
  const NamespaceHosts::Ran ran = hosts.Run(submit_host, s.argv);
  EXPECT_EQ(ran.exit_code, 0) << "the submit Job's command:\n"
                              << ran.out << "\ncoordinator:\n"
                              << pipetrain::client::LogTail(c.log, 20);
  EXPECT_THAT(ran.out, HasSubstr("succeeded"));
  // The pipeline's activations, gradients and AllReduces crossed the worker hosts' links.
  for (int i = 0; i < replicas; ++i) {
    EXPECT_GT(hosts.TxBytes(1 + i, "eth0") - sent_before[i], 10000) << "worker host " << 1 + i;
  }
}

}  // namespace
}  // namespace pipetrain::kubernetes_test
