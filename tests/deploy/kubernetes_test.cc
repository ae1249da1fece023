// deploy/kubernetes/ against the real tools and the real daemons. Every overlay renders with
// `kubectl kustomize`; the rendered objects are checked (selectors against labels, Service
// ports against container ports, probe and scrape ports against the ports the daemons'
// flags open, the token from the Secret, GPUs only in limits); deploy/prometheus's
// Kubernetes configuration, applied to the rendered pods, scrapes each pod's /metrics; and
// each container's exact command line starts the real binaries: the coordinator and four
// workers of the cpu overlay serve their gRPC probes and /metrics, and the submit Job's
// command trains the ConfigMap's job to success. What a cluster would provide is replaced
// one for one: $(POD_IP) by a loopback address per pod, a Service name by 127.0.0.1 and the
// port its targetPort names, a volume's mount path by a directory (the Secret's key, the
// ConfigMap's data, an empty volume).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <yaml-cpp/yaml.h>

#include "client/daemon_process.h"
#include "runtime/base/subprocess.h"
#include "rpc/health.h"
#include "runtime/base/exit_codes.h"
#include "tests/daemons/local_cluster.h"

namespace {

namespace fs = std::filesystem;
using ::pipetrain::test::DaemonTest;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::testing::HasSubstr;

const fs::path kDeploy = fs::path(PIPETRAIN_SOURCE_DIR) / "deploy";
const std::vector<std::string> kOverlays = {"cpu", "gpu"};

// stdout of `command` (run by the shell), and its exit code.
std::pair<int, std::string> Capture(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool HaveKubectl() { return Capture("command -v kubectl >/dev/null 2>&1").first == 0; }

// The objects `kubectl kustomize` renders for an overlay.
std::vector<YAML::Node> Render(const std::string& overlay) {
  const auto [code, out] = Capture("timeout 60 kubectl kustomize " +
                                   (kDeploy / "kubernetes" / "overlays" / overlay).string());
  EXPECT_EQ(code, 0) << "kubectl kustomize " << overlay << " failed";
  std::vector<YAML::Node> objects;
  for (const YAML::Node& doc : YAML::LoadAll(out)) {
    if (doc.IsMap()) objects.push_back(doc);
  }
  return objects;
}

std::string KindName(const YAML::Node& o) {
  return o["kind"].as<std::string>() + "/" + o["metadata"]["name"].as<std::string>();
}

const YAML::Node* Find(const std::vector<YAML::Node>& objects, const std::string& kind,
                       const std::string& name_prefix) {
  for (const YAML::Node& o : objects) {
    if (o["kind"].as<std::string>() == kind &&
        o["metadata"]["name"].as<std::string>().rfind(name_prefix, 0) == 0) {
      return &o;
    }
  }
  return nullptr;
}

// node[path[0]][path[1]]...; an undefined node where a key is missing (yaml-cpp throws when
// a missing key's node is indexed again).
YAML::Node At(const YAML::Node& node, std::initializer_list<const char*> path) {
  YAML::Node at = node;
  for (const char* key : path) {
    if (!at.IsMap() || !at[key]) return YAML::Node(YAML::NodeType::Undefined);
    at.reset(at[key]);
  }
  return at;
}

// The pod template of a workload (StatefulSet, Job); an undefined node for anything else.
YAML::Node PodTemplate(const YAML::Node& o) {
  const std::string kind = o["kind"].as<std::string>();
  if (kind == "StatefulSet" || kind == "Deployment" || kind == "Job") return o["spec"]["template"];
  return YAML::Node(YAML::NodeType::Undefined);
}

std::map<std::string, std::string> StringMap(const YAML::Node& node) {
  std::map<std::string, std::string> out;
  if (node && node.IsMap()) {
    for (const auto& kv : node) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  return out;
}

bool Subset(const std::map<std::string, std::string>& small,
            const std::map<std::string, std::string>& big) {
  for (const auto& [k, v] : small) {
    auto it = big.find(k);
    if (it == big.end() || it->second != v) return false;
  }
  return true;
}

// The value of `--name=VALUE` among a container's args ("" if absent).
std::string Flag(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& a : container["args"]) {
    const std::string arg = a.as<std::string>();
    if (arg.rfind(name + "=", 0) == 0) return arg.substr(name.size() + 1);
  }
  return "";
}

int PortOf(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  return colon == std::string::npos ? -1 : std::atoi(host_port.c_str() + colon + 1);
}

// The containerPort a container declares under `name` (-1 if none).
int ContainerPort(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& p : container["ports"]) {
    if (p["name"] && p["name"].as<std::string>() == name) return p["containerPort"].as<int>();
  }
  return -1;
}

class KubernetesTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    if (!HaveKubectl()) {
      GTEST_SKIP() << "kubectl is not installed (it is not a Debian 12 package; .ci/run lends "
                      "the machine's to the root it tests in)";
    }
  }
};

// Each overlay renders, with every object the deployment needs, all in one namespace.
TEST_F(KubernetesTest, EveryOverlayRendersTheWholeDeployment) {
  for (const std::string& overlay : kOverlays) {
    SCOPED_TRACE(overlay);
    const std::vector<YAML::Node> objects = Render(overlay);
    std::set<std::string> names;
    for (const YAML::Node& o : objects) {
      names.insert(KindName(o));
      if (o["kind"].as<std::string>() != "Namespace") {
        EXPECT_EQ(o["metadata"]["namespace"].as<std::string>(""), "pipetrain") << KindName(o);
      }
      EXPECT_EQ(o["metadata"]["labels"]["app.kubernetes.io/part-of"].as<std::string>(""),
                "pipetrain")
          << KindName(o);
    }
    for (const char* want :
         {"Namespace/pipetrain", "Service/pipetrain-coordinator", "Service/pipetrain-worker",
          "StatefulSet/pipetrain-coordinator", "StatefulSet/pipetrain-worker",
          "Job/pipetrain-submit"}) {
      EXPECT_EQ(names.count(want), 1u) << want;
    }
    EXPECT_NE(Find(objects, "ConfigMap", "pipetrain-job"), nullptr);
    // The coordinator keeps its SQLite file on a persistent volume, where --db points.
    const YAML::Node& coordinator = *Find(objects, "StatefulSet", "pipetrain-coordinator");
    EXPECT_EQ(coordinator["spec"]["replicas"].as<int>(), 1);
    const YAML::Node claim = At(coordinator, {"spec", "volumeClaimTemplates"})[0];
    ASSERT_TRUE(claim) << "the coordinator has no persistent volume";
    const YAML::Node container = coordinator["spec"]["template"]["spec"]["containers"][0];
    std::string db_dir;
    for (const YAML::Node& m : container["volumeMounts"]) {
      if (m["name"].as<std::string>() == claim["metadata"]["name"].as<std::string>()) {
        db_dir = m["mountPath"].as<std::string>();
      }
    }
    ASSERT_FALSE(db_dir.empty());
    EXPECT_EQ(fs::path(Flag(container, "--db")).parent_path().string(), db_dir);
  }
}

// Every selector selects what it should: a Service's selector matches the pod labels of
// exactly one workload, a StatefulSet's matchLabels its own template's labels, and its
// serviceName names a Service; the workers' Service is headless (a DNS name per pod).
TEST_F(KubernetesTest, SelectorsMatchTheLabelsOfThePodsTheyMeanToSelect) {
  for (const std::string& overlay : kOverlays) {
    SCOPED_TRACE(overlay);
    const std::vector<YAML::Node> objects = Render(overlay);
    for (const YAML::Node& o : objects) {
      const YAML::Node pod = PodTemplate(o);
      if (!pod) continue;
      const auto labels = StringMap(pod["metadata"]["labels"]);
      if (o["spec"]["selector"]) {
        const auto match = StringMap(o["spec"]["selector"]["matchLabels"]);
        EXPECT_FALSE(match.empty()) << KindName(o);
        EXPECT_TRUE(Subset(match, labels)) << KindName(o) << ": its selector misses its pods";
      }
      if (o["kind"].as<std::string>() == "StatefulSet") {
        EXPECT_NE(Find(objects, "Service", o["spec"]["serviceName"].as<std::string>()), nullptr)
            << KindName(o);
      }
    }
    for (const YAML::Node& service : objects) {
      if (service["kind"].as<std::string>() != "Service") continue;
      const auto selector = StringMap(service["spec"]["selector"]);
      ASSERT_FALSE(selector.empty()) << KindName(service);
      std::vector<const YAML::Node*> selected;
      for (const YAML::Node& o : objects) {
        const YAML::Node pod = PodTemplate(o);
        if (pod && Subset(selector, StringMap(pod["metadata"]["labels"]))) selected.push_back(&o);
      }
      ASSERT_EQ(selected.size(), 1u) << KindName(service) << " selects " << selected.size()
                                     << " workloads";
      EXPECT_EQ((*selected[0])["kind"].as<std::string>(), "StatefulSet");
      // Each Service port targets a port the selected container declares, by name, with the
      // same number (clients use the Service port, the daemons' flags the container port).
      const YAML::Node container = PodTemplate(*selected[0])["spec"]["containers"][0];
      for (const YAML::Node& p : service["spec"]["ports"]) {
        const int target = ContainerPort(container, p["targetPort"].as<std::string>());
        EXPECT_GT(target, 0) << KindName(service) << " targets "
                             << p["targetPort"].as<std::string>();
        EXPECT_EQ(p["port"].as<int>(), target) << KindName(service);
      }
    }
    EXPECT_EQ((*Find(objects, "Service", "pipetrain-worker"))["spec"]["clusterIP"].as<std::string>(""),
              "None");
  }
}

// The probes ask gRPC health on the port the daemon's --listen opens (the worker for the
// service it marks SERVING); the scrape annotations name the port --metrics-listen opens;
// the workers find the coordinator by its Service name and gRPC port; every --token-file is
// the key "token" of the Secret pipetrain-token, mounted.
TEST_F(KubernetesTest, ProbeScrapeAndPeerPortsAreThoseTheDaemonsOpen) {
  for (const std::string& overlay : kOverlays) {
    SCOPED_TRACE(overlay);
    const std::vector<YAML::Node> objects = Render(overlay);
    const YAML::Node& coordinator_service = *Find(objects, "Service", "pipetrain-coordinator");
    int coordinator_grpc = -1;
    for (const YAML::Node& p : coordinator_service["spec"]["ports"]) {
      if (p["name"].as<std::string>() == "grpc") coordinator_grpc = p["port"].as<int>();
    }
    int daemons = 0, token_files = 0;
    for (const YAML::Node& o : objects) {
      const YAML::Node pod = PodTemplate(o);
      if (!pod) continue;
      for (const YAML::Node& c : pod["spec"]["containers"]) {
        SCOPED_TRACE(KindName(o));
        const std::string token_file = Flag(c, "--token-file");
        ASSERT_FALSE(token_file.empty()) << "no --token-file";
        ++token_files;
        bool from_secret = false;
        for (const YAML::Node& m : c["volumeMounts"]) {
          if (fs::path(token_file).parent_path() != fs::path(m["mountPath"].as<std::string>())) {
            continue;
          }
          for (const YAML::Node& v : pod["spec"]["volumes"]) {
            from_secret |= v["name"].as<std::string>() == m["name"].as<std::string>() &&
                           v["secret"] &&
                           v["secret"]["secretName"].as<std::string>() == "pipetrain-token";
          }
        }
        EXPECT_TRUE(from_secret) << token_file << " is not the Secret pipetrain-token";
        EXPECT_EQ(fs::path(token_file).filename(), "token");

        const std::string command = c["command"][0].as<std::string>();
        if (command == "pipetrain") continue;  // the submit Job: no port of its own
        ++daemons;
        const int grpc = ContainerPort(c, "grpc"), metrics = ContainerPort(c, "metrics");
        EXPECT_EQ(PortOf(Flag(c, "--listen")), grpc);
        EXPECT_EQ(PortOf(Flag(c, "--metrics-listen")), metrics);
        for (const char* probe : {"readinessProbe", "livenessProbe"}) {
          ASSERT_TRUE(At(c, {probe, "grpc"})) << probe << " is not a gRPC probe";
          EXPECT_EQ(c[probe]["grpc"]["port"].as<int>(), grpc) << probe;
          if (command == "pipetrain-worker") {
            EXPECT_EQ(At(c, {probe, "grpc", "service"}).as<std::string>(""),
                      "pipetrain.v1.WorkerService");
          }
        }
        const auto annotations = StringMap(pod["metadata"]["annotations"]);
        EXPECT_EQ(annotations.at("prometheus.io/scrape"), "true");
        EXPECT_EQ(std::stoi(annotations.at("prometheus.io/port")), metrics);
        EXPECT_EQ(annotations.at("prometheus.io/path"), "/metrics");
        if (command == "pipetrain-worker") {
          // The worker gives the coordinator and its peers the address it listens on: the
          // pod's IP, from the downward API.
          EXPECT_EQ(Flag(c, "--coordinator"),
                    "pipetrain-coordinator:" + std::to_string(coordinator_grpc));
          EXPECT_THAT(Flag(c, "--listen"), HasSubstr("$(POD_IP):"));
          EXPECT_EQ(Flag(c, "--data-host"), "$(POD_IP)");
          bool pod_ip = false;
          for (const YAML::Node& e : c["env"]) {
            pod_ip |= e["name"].as<std::string>() == "POD_IP" &&
                      At(e, {"valueFrom", "fieldRef", "fieldPath"}).as<std::string>("") ==
                          "status.podIP";
          }
          EXPECT_TRUE(pod_ip) << "POD_IP is not the pod's IP";
        }
      }
    }
    EXPECT_EQ(daemons, 2);
    EXPECT_EQ(token_files, 3);
  }
}

// nvidia.com/gpu appears only in the gpu overlay, only on the workers, only in limits (the
// scheduler copies limits to requests for extended resources), one per pod.
TEST_F(KubernetesTest, GpusAreRequestedOnlyInTheWorkersLimitsOfTheGpuOverlay) {
  for (const std::string& overlay : kOverlays) {
    SCOPED_TRACE(overlay);
    int gpu_containers = 0;
    for (const YAML::Node& o : Render(overlay)) {
      const YAML::Node pod = PodTemplate(o);
      if (!pod) continue;
      for (const YAML::Node& c : pod["spec"]["containers"]) {
        EXPECT_FALSE(At(c, {"resources", "requests", "nvidia.com/gpu"})) << KindName(o);
        if (At(c, {"resources", "limits", "nvidia.com/gpu"})) {
          ++gpu_containers;
          EXPECT_EQ(o["metadata"]["name"].as<std::string>(), "pipetrain-worker");
          EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 1);
          EXPECT_EQ(Flag(c, "--device"), "cuda");
        }
      }
    }
    EXPECT_EQ(gpu_containers, overlay == "gpu" ? 1 : 0);
  }
}

// --- deploy/prometheus/prometheus-kubernetes.yml, applied to the rendered pods.

// Prometheus's relabelling (keep and replace; regexes anchored at both ends) of one target.
std::optional<std::map<std::string, std::string>> Relabel(
    std::map<std::string, std::string> labels, const YAML::Node& configs) {
  for (const YAML::Node& rc : configs) {
    std::string value;
    const std::string separator = rc["separator"].as<std::string>(";");
    bool first = true;
    for (const YAML::Node& s : rc["source_labels"]) {
      if (!first) value += separator;
      first = false;
      value += labels[s.as<std::string>()];
    }
    const std::regex regex("^(?:" + rc["regex"].as<std::string>("(.*)") + ")$");
    const std::string action = rc["action"].as<std::string>("replace");
    std::smatch match;
    const bool matched = std::regex_match(value, match, regex);
    if (action == "keep") {
      if (!matched) return std::nullopt;
    } else if (action == "replace") {
      if (!matched) continue;
      std::string replacement = rc["replacement"].as<std::string>("$1");
      for (size_t i = match.size(); i-- > 1;) {
        const std::string ref = "$" + std::to_string(i);
        for (size_t at; (at = replacement.find(ref)) != std::string::npos;) {
          replacement.replace(at, ref.size(), match[i].str());
        }
      }
      labels[rc["target_label"].as<std::string>()] = replacement;
    } else {
      ADD_FAILURE() << "relabel action " << action << " is not simulated here";
    }
  }
  return labels;
}

// Kubernetes discovery gives one target per declared container port (address POD_IP:PORT,
// the pod's annotations and labels as meta labels); the configuration keeps one per
// scraped pod, at the annotated port and path: the daemon's --metrics-listen port.
TEST_F(KubernetesTest, PrometheusPodDiscoveryScrapesEachDaemonsMetricsPort) {
  const YAML::Node config = YAML::LoadFile((kDeploy / "prometheus" / "prometheus-kubernetes.yml").string());
  const YAML::Node scrape = config["scrape_configs"][0];
  ASSERT_EQ(scrape["kubernetes_sd_configs"][0]["role"].as<std::string>(), "pod");
  EXPECT_EQ(scrape["kubernetes_sd_configs"][0]["namespaces"]["names"][0].as<std::string>(),
            "pipetrain");
  EXPECT_EQ(config["rule_files"][0].as<std::string>(), "alerts.yml");
  const std::vector<YAML::Node> objects = Render("cpu");
  std::map<std::string, std::string> scraped;  // workload -> address and path
  for (const YAML::Node& o : objects) {
    const YAML::Node pod = PodTemplate(o);
    if (!pod) continue;
    const std::string pod_ip = "10.1.2." + std::to_string(scraped.size() + 10);
    for (const YAML::Node& c : pod["spec"]["containers"]) {
      for (const YAML::Node& p : c["ports"]) {
        std::map<std::string, std::string> labels = {
            {"__address__", pod_ip + ":" + p["containerPort"].as<std::string>()},
            {"__metrics_path__", "/metrics"},
            {"__meta_kubernetes_namespace", o["metadata"]["namespace"].as<std::string>()},
            {"__meta_kubernetes_pod_name", o["metadata"]["name"].as<std::string>() + "-0"},
            {"__meta_kubernetes_pod_container_port_name", p["name"].as<std::string>("")}};
        for (const auto& [k, v] : StringMap(pod["metadata"]["annotations"])) {
          labels["__meta_kubernetes_pod_annotation_" + std::regex_replace(k, std::regex("[^a-zA-Z0-9]"), "_")] = v;
        }
        for (const auto& [k, v] : StringMap(pod["metadata"]["labels"])) {
          labels["__meta_kubernetes_pod_label_" + std::regex_replace(k, std::regex("[^a-zA-Z0-9]"), "_")] = v;
        }
        const auto target = Relabel(labels, scrape["relabel_configs"]);
        if (!target) continue;
        const std::string name = o["metadata"]["name"].as<std::string>();
        EXPECT_EQ(scraped.count(name), 0u) << name << " is scraped twice";
        scraped[name] = target->at("__address__") + target->at("__metrics_path__");
        EXPECT_EQ(target->at("__address__"),
                  pod_ip + ":" + std::to_string(PortOf(Flag(c, "--metrics-listen"))));
        EXPECT_EQ(target->at("namespace"), "pipetrain");
        EXPECT_EQ(target->at("pod"), name + "-0");
      }
    }
  }
  EXPECT_EQ(scraped.size(), 2u) << "the coordinator and the workers, not the submit Job";
  EXPECT_EQ(scraped.count("pipetrain-coordinator"), 1u);
  EXPECT_EQ(scraped.count("pipetrain-worker"), 1u);
  for (const auto& [name, where] : scraped) EXPECT_THAT(where, HasSubstr("/metrics")) << name;
}

// --- The containers' command lines, run.

// A rendered pod's container as this machine runs it: $(VAR) from the container's env
// (POD_IP: `pod_ip`), a Service's name:port as 127.0.0.1 and the port its targetPort names,
// each mount path as a directory under `root` holding what the volume would.
struct Launch {
  std::vector<std::string> argv;
  std::string log;
};

class ContainerRunner {
 public:
  ContainerRunner(std::vector<YAML::Node> objects, fs::path root)
      : objects_(std::move(objects)), root_(std::move(root)) {}

  Launch Prepare(const YAML::Node& workload, const std::string& pod_ip, const std::string& name) {
    const YAML::Node pod = PodTemplate(workload);
    const YAML::Node c = pod["spec"]["containers"][0];
    const fs::path dir = root_ / name;
    std::map<std::string, fs::path> mounts;  // mount path -> local directory
    for (const YAML::Node& m : c["volumeMounts"]) {
      const std::string volume = m["name"].as<std::string>();
      const fs::path local = dir / volume;
      fs::create_directories(local);
      mounts[m["mountPath"].as<std::string>()] = local;
      for (const YAML::Node& v : pod["spec"]["volumes"]) {
        if (v["name"].as<std::string>() != volume) continue;
        if (v["secret"]) {
          EXPECT_EQ(v["secret"]["secretName"].as<std::string>(), "pipetrain-token");
          std::ofstream(local / "token") << kToken << "\n";
        }
        if (v["configMap"]) {
          const YAML::Node* map = Find(objects_, "ConfigMap", v["configMap"]["name"].as<std::string>());
          EXPECT_NE(map, nullptr) << v["configMap"]["name"].as<std::string>();
          if (map == nullptr) continue;
          for (const auto& kv : (*map)["data"]) {
            std::ofstream(local / kv.first.as<std::string>()) << kv.second.as<std::string>();
          }
        }
      }
    }
    std::map<std::string, std::string> env;
    for (const YAML::Node& e : c["env"]) {
      const std::string var = e["name"].as<std::string>();
      if (e["value"]) env[var] = e["value"].as<std::string>();
      if (At(e, {"valueFrom", "fieldRef", "fieldPath"}).as<std::string>("") == "status.podIP") {
        env[var] = pod_ip;
      }
    }
    Launch launch;
    const std::string command = c["command"][0].as<std::string>();
    launch.argv.push_back(command == "pipetrain-coordinator" ? LocalCluster::coordinator_path()
                          : command == "pipetrain-worker"    ? LocalCluster::worker_path()
                          : command == "pipetrain"           ? LocalCluster::cli_path()
                                                             : "/nonexistent/" + command);
    for (const YAML::Node& a : c["args"]) {
      std::string arg = a.as<std::string>();
      for (const auto& [var, value] : env) {
        for (size_t at; (at = arg.find("$(" + var + ")")) != std::string::npos;) {
          arg.replace(at, var.size() + 3, value);
        }
      }
      for (const auto& [path, local] : mounts) {
        const size_t at = arg.find(path + "/");
        if (at != std::string::npos) arg.replace(at, path.size(), local.string());
      }
      for (const YAML::Node& s : objects_) {
        if (s["kind"].as<std::string>() != "Service") continue;
        for (const YAML::Node& p : s["spec"]["ports"]) {
          const std::string dns = s["metadata"]["name"].as<std::string>() + ":" +
                                  p["port"].as<std::string>();
          const size_t at = arg.find(dns);
          if (at != std::string::npos) {
            arg.replace(at, dns.size(), "127.0.0.1:" + TargetPort(s, p));
          }
        }
      }
      EXPECT_EQ(arg.find("$("), std::string::npos) << "unexpanded variable in " << arg;
      launch.argv.push_back(arg);
    }
    launch.log = (dir / (name + ".log")).string();
    return launch;
  }

  static constexpr const char* kToken = "k8s-test-token-5f1c";

 private:
  // The number behind a Service port's targetPort (a name of the selected container's port).
  std::string TargetPort(const YAML::Node& service, const YAML::Node& port) {
    const auto selector = StringMap(service["spec"]["selector"]);
    for (const YAML::Node& o : objects_) {
      const YAML::Node pod = PodTemplate(o);
      if (pod && Subset(selector, StringMap(pod["metadata"]["labels"]))) {
        return std::to_string(
            ContainerPort(pod["spec"]["containers"][0], port["targetPort"].as<std::string>()));
      }
    }
    return "0";
  }

  std::vector<YAML::Node> objects_;
  fs::path root_;
};

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
      << "the coordinator's readiness probe never passed:\n" << pipetrain::client::LogTail(c.log);
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
    ASSERT_TRUE(WaitUntilServing(pids.back(), pod_ip + ":" + std::to_string(ContainerPort(wc, "grpc")),
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
  EXPECT_EQ(exit_code, 0) << "the submit Job's command:\n" << pipetrain::client::LogTail(s.log, 20)
                          << "\ncoordinator:\n" << pipetrain::client::LogTail(c.log, 20);
  EXPECT_THAT(ReadFile(s.log), HasSubstr("succeeded"));
}

// The gpu overlay's worker command line parses (a renamed flag would fail before this) and
// reaches the device check: where no GPU is visible the worker says so and does not start.
TEST_F(KubernetesTest, TheGpuOverlaysWorkerCommandLineParsesAndAsksForCuda) {
  const std::vector<YAML::Node> objects = Render("gpu");
  ContainerRunner runner(objects, dir_);
  const Launch w = runner.Prepare(*Find(objects, "StatefulSet", "pipetrain-worker"),
                                  "127.0.99.50", "gpu-worker");
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
