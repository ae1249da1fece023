// How the deploy/kubernetes tests run a rendered pod's container on this machine, from its
// exact command line: what a cluster would provide is replaced one for one (see
// ContainerRunner). Pure but for the files it writes under its root; not thread-safe.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "tests/deploy/kubernetes_fixture.h"

namespace pipetrain::kubernetes_test {

// A rendered pod's container as this machine runs it: $(VAR) from the container's env
// (POD_IP: `pod_ip`; the node's name: "node-" and `pod_ip`, a node per pod), a Service's name:port
// as the address of the host its pods run on (as SetServiceHost says; 127.0.0.1 unless said) and
// the port its targetPort names, each mount path as a directory under `root` holding what the
// volume would.
struct Launch {
  std::vector<std::string> argv;
  std::string log;
};

class ContainerRunner {
 public:
  ContainerRunner(std::vector<YAML::Node> objects, fs::path root)
      : objects_(std::move(objects)), root_(std::move(root)) {}

  // The Service named `service` resolves to `address` (its pods' host) from now on.
  void SetServiceHost(const std::string& service, const std::string& address) {
    service_hosts_[service] = address;
  }

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
          const YAML::Node* map =
              Find(objects_, "ConfigMap", v["configMap"]["name"].as<std::string>());
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
      const std::string field = At(e, {"valueFrom", "fieldRef", "fieldPath"}).as<std::string>("");
      if (field == "status.podIP") env[var] = pod_ip;
      if (field == "spec.nodeName") env[var] = "node-" + pod_ip;  // a node per pod here
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
          const std::string service = s["metadata"]["name"].as<std::string>();
          const std::string dns = service + ":" + p["port"].as<std::string>();
          const size_t at = arg.find(dns);
          if (at != std::string::npos) {
            const auto host = service_hosts_.find(service);
            arg.replace(at, dns.size(),
                        (host == service_hosts_.end() ? std::string("127.0.0.1") : host->second) +
                            ":" + TargetPort(s, p));
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
  std::map<std::string, std::string> service_hosts_;  // Service name -> address
};

}  // namespace pipetrain::kubernetes_test
