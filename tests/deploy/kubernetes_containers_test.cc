// deploy/kubernetes's containers run from their exact command lines on this machine: the cpu
// overlay's coordinator and four workers serve their gRPC probes and /metrics and the submit
// Job's command trains the ConfigMap's job to success; the gpu overlay's worker parses its
// flags and asks for CUDA; every command is a program the image installs. What a cluster
// would provide is replaced one for one: $(POD_IP) by a loopback address per pod, a Service
// name by 127.0.0.1 and the port its targetPort names, a volume's mount path by a directory
// (the Secret's key, the ConfigMap's data, an empty volume).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <yaml-cpp/yaml.h>

#include "client/daemon_process.h"
#include "rpc/health.h"
#include "runtime/base/exit_codes.h"
#include "runtime/base/subprocess.h"
#include "tests/deploy/container_runner.h"
#include "tests/deploy/kubernetes_fixture.h"

namespace pipetrain::kubernetes_test {
namespace {

// What the kubelet's gRPC probe asks: grpc.health.v1 Check at host:port for `service`.
bool ProbeServing(const std::string& address, const std::string& service) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  bool serving = false;
  return pipetrain::rpc::CheckServing(channel, &ctx, &serving, service).ok() && serving;
}

// Polls the probe until it says SERVING (or the process exits, or 30 s pass).
bool WaitUntilServing(pid_t pid, const std::string& address, const std::string& service) {
  for (int i = 0; i < 300; ++i) {
    if (ProbeServing(address, service)) return true;
    if (pipetrain::subprocess::Exited(pid)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

std::pair<int, std::string> Scrape(const std::string& host, int port, const std::string& path) {
  httplib::Client client(host, port);
  client.set_connection_timeout(2);
  auto res = client.Get(path.c_str());
  if (!res) return {-1, ""};
  return {res->status, res->body};
}

// Runs a process to its end; its exit code (-1: killed after `timeout`, or by a signal).
int RunToEnd(const Launch& launch, std::chrono::seconds timeout) {
  const pid_t pid = pipetrain::client::SpawnDaemon(launch.argv, launch.log, SIGKILL);
  if (pid <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Whether 0.0.0.0:port is taken already (then the coordinator's command line cannot start).
// With SO_REUSEADDR, as the daemons bind: a connection in TIME_WAIT does not count.
bool PortTaken(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool taken = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0;
  close(fd);
  return taken;
}

// The cpu overlay as a cluster would run it: the coordinator and its four workers from their
// exact command lines serve their probes and /metrics, and the submit Job's command line
// trains the ConfigMap's job to success (the CLI exits 0 only if the job succeeded).
TEST_F(KubernetesTest, TheCpuOverlaysCommandLinesStartTheDaemonsAndTrainTheJob) {
  const std::vector<YAML::Node> objects = Render("cpu");
  ContainerRunner runner(objects, dir_);
  const YAML::Node& coordinator = *Find(objects, "StatefulSet", "pipetrain-coordinator");
  const YAML::Node& workers = *Find(objects, "StatefulSet", "pipetrain-worker");
  const YAML::Node& submit = *Find(objects, "Job", "pipetrain-submit");
  const YAML::Node cc = coordinator["spec"]["template"]["spec"]["containers"][0];
  const int coordinator_port = ContainerPort(cc, "grpc");
  ASSERT_FALSE(PortTaken(coordinator_port))
      << "port " << coordinator_port << " is in use on this machine: the coordinator's "
      << "command line binds it";
  ASSERT_FALSE(PortTaken(ContainerPort(cc, "metrics")));

  std::vector<pid_t> pids;
  struct Cleanup {
    std::vector<pid_t>* pids;
    ~Cleanup() {
      for (pid_t pid : *pids) pipetrain::subprocess::Stop(pid, SIGKILL, absl::Seconds(5));
    }
  } cleanup{&pids};

  const Launch c = runner.Prepare(coordinator, "127.0.99.1", "coordinator");
  pids.push_back(pipetrain::client::SpawnDaemon(c.argv, c.log, SIGKILL));
  ASSERT_TRUE(WaitUntilServing(pids.back(), "127.0.0.1:" + std::to_string(coordinator_port), ""))
      << "the coordinator's readiness probe never passed:\n"
      << pipetrain::client::LogTail(c.log);
  const auto annotations = StringMap(coordinator["spec"]["template"]["metadata"]["annotations"]);
  const auto [code, text] = Scrape("127.0.0.1", std::stoi(annotations.at("prometheus.io/port")),
                                   annotations.at("prometheus.io/path"));
  EXPECT_EQ(code, 200);
  EXPECT_THAT(text, HasSubstr("pipetrain_workers"));

  const YAML::Node wc = workers["spec"]["template"]["spec"]["containers"][0];
  const auto worker_annotations = StringMap(workers["spec"]["template"]["metadata"]["annotations"]);
  const int replicas = workers["spec"]["replicas"].as<int>();
  for (int i = 0; i < replicas; ++i) {
    const std::string pod_ip = "127.0.99." + std::to_string(10 + i);
    const Launch w = runner.Prepare(workers, pod_ip, "worker-" + std::to_string(i));
    pids.push_back(pipetrain::client::SpawnDaemon(w.argv, w.log, SIGKILL));
    ASSERT_TRUE(WaitUntilServing(pids.back(),
                                 pod_ip + ":" + std::to_string(ContainerPort(wc, "grpc")),
                                 wc["readinessProbe"]["grpc"]["service"].as<std::string>()))
        << "worker " << i << "'s readiness probe never passed:\n"
        << pipetrain::client::LogTail(w.log);
    const auto [wcode, wtext] =
        Scrape(pod_ip, std::stoi(worker_annotations.at("prometheus.io/port")),
               worker_annotations.at("prometheus.io/path"));
    EXPECT_EQ(wcode, 200) << "worker " << i;
    EXPECT_THAT(wtext, HasSubstr("pipetrain_build_info"));
  }

  const Launch s = runner.Prepare(submit, "127.0.99.200", "submit");
  const int exit_code = RunToEnd(s, std::chrono::seconds(180));
  EXPECT_EQ(exit_code, 0) << "the submit Job's command:\n"
                          << pipetrain::client::LogTail(s.log, 20) << "\ncoordinator:\n"
                          << pipetrain::client::LogTail(c.log, 20);
  EXPECT_THAT(ReadFile(s.log), HasSubstr("succeeded"));
}

// The gpu overlay's worker command line parses (a renamed flag would fail before this) and
// reaches the device check: where no GPU is visible the worker says so and does not start.
TEST_F(KubernetesTest, TheGpuOverlaysWorkerCommandLineParsesAndAsksForCuda) {
  const std::vector<YAML::Node> objects = Render("gpu");
  ContainerRunner runner(objects, dir_);
  const Launch w = runner.Prepare(*Find(objects, "StatefulSet", "pipetrain-worker"), "127.0.99.50",
                                  "gpu-worker");
  EXPECT_EQ(RunToEnd(w, std::chrono::seconds(30)), pipetrain::exit_code::kUsage) << ReadFile(w.log);
  EXPECT_THAT(ReadFile(w.log), HasSubstr("--device cuda: this process sees 0 CUDA devices"));
}

// Each container's command is a program the image installs in /usr/local/bin.
TEST_F(KubernetesTest, EveryContainerRunsAProgramTheImageInstalls) {
  const std::string dockerfile = ReadFile(kDeploy / "container" / "Dockerfile");
  for (const std::string& overlay : kOverlays) {
    for (const YAML::Node& o : Render(overlay)) {
      const YAML::Node pod = PodTemplate(o);
      if (!pod) continue;
      for (const YAML::Node& c : pod["spec"]["containers"]) {
        const std::string command = c["command"][0].as<std::string>();
        EXPECT_THAT(dockerfile, HasSubstr("/usr/local/bin/" + command + " "))
            << KindName(o) << " runs " << command;
        EXPECT_EQ(c["image"].as<std::string>(), "localhost/pipetrain:" + overlay);
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::kubernetes_test
