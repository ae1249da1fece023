// The fixture and helpers of the deploy/kubernetes tests (one binary, kubernetes_test): the
// objects `kubectl kustomize` renders for an overlay, lookups in them (by kind and name, by
// path, pod templates, labels, a container's flags and ports), and KubernetesTest, a daemon
// test that is skipped where kubectl is not installed. PIPETRAIN_SOURCE_DIR is the checkout
// (the target's compile definition). A failed render fails the calling test and yields what
// parsed; the helpers are otherwise pure and run on the calling thread.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "runtime/base/host_port.h"
#include "tests/daemons/local_cluster.h"

namespace pipetrain::kubernetes_test {

namespace fs = std::filesystem;
using ::pipetrain::test::DaemonTest;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::testing::HasSubstr;

inline const fs::path kDeploy = fs::path(PIPETRAIN_SOURCE_DIR) / "deploy";
inline const std::vector<std::string> kOverlays = {"cpu", "gpu"};

// stdout of `command` (run by the shell), and its exit code.
inline std::pair<int, std::string> Capture(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, ""};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline bool HaveKubectl() { return Capture("command -v kubectl >/dev/null 2>&1").first == 0; }

// The objects `kubectl kustomize` renders for an overlay.
inline std::vector<YAML::Node> Render(const std::string& overlay) {
  const auto [code, out] = Capture("timeout 60 kubectl kustomize " +
                                   (kDeploy / "kubernetes" / "overlays" / overlay).string());
  EXPECT_EQ(code, 0) << "kubectl kustomize " << overlay << " failed";
  std::vector<YAML::Node> objects;
  for (const YAML::Node& doc : YAML::LoadAll(out)) {
    if (doc.IsMap()) objects.push_back(doc);
  }
  return objects;
}

inline std::string KindName(const YAML::Node& o) {
  return o["kind"].as<std::string>() + "/" + o["metadata"]["name"].as<std::string>();
}

inline const YAML::Node* Find(const std::vector<YAML::Node>& objects, const std::string& kind,
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
inline YAML::Node At(const YAML::Node& node, std::initializer_list<const char*> path) {
  YAML::Node at = node;
  for (const char* key : path) {
    if (!at.IsMap() || !at[key]) return YAML::Node(YAML::NodeType::Undefined);
    at.reset(at[key]);
  }
  return at;
}

// The pod template of a workload (StatefulSet, Job); an undefined node for anything else.
inline YAML::Node PodTemplate(const YAML::Node& o) {
  const std::string kind = o["kind"].as<std::string>();
  if (kind == "StatefulSet" || kind == "Deployment" || kind == "Job") return o["spec"]["template"];
  return YAML::Node(YAML::NodeType::Undefined);
}

inline std::map<std::string, std::string> StringMap(const YAML::Node& node) {
  std::map<std::string, std::string> out;
  if (node && node.IsMap()) {
    for (const auto& kv : node) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  return out;
}

inline bool Subset(const std::map<std::string, std::string>& small,
                   const std::map<std::string, std::string>& big) {
  for (const auto& [k, v] : small) {
    auto it = big.find(k);
    if (it == big.end() || it->second != v) return false;
  }
  return true;
}

// The value of `--name=VALUE` among a container's args ("" if absent).
inline std::string Flag(const YAML::Node& container, const std::string& name) {
  for (const YAML::Node& a : container["args"]) {
    const std::string arg = a.as<std::string>();
    if (arg.rfind(name + "=", 0) == 0) return arg.substr(name.size() + 1);
  }
  return "";
}

inline int PortOf(const std::string& host_port) {
  const absl::StatusOr<HostPort> parsed = ParseHostPort(host_port);
  return parsed.ok() ? parsed->port : -1;
}

// The containerPort a container declares under `name` (-1 if none).
inline int ContainerPort(const YAML::Node& container, const std::string& name) {
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

}  // namespace pipetrain::kubernetes_test
