// deploy/prometheus/prometheus-kubernetes.yml applied to the pods of the rendered overlays:
// Kubernetes pod discovery and Prometheus's relabelling (keep and replace) simulated, the
// configuration keeps one target per scraped pod, at the port the daemon's --metrics-listen
// opens.
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "tests/deploy/kubernetes_fixture.h"

namespace pipetrain::kubernetes_test {
namespace {

// Prometheus's relabelling (keep and replace; regexes anchored at both ends) of one target.
std::optional<std::map<std::string, std::string>> Relabel(std::map<std::string, std::string> labels,
                                                          const YAML::Node& configs) {
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
  const YAML::Node config =
      YAML::LoadFile((kDeploy / "prometheus" / "prometheus-kubernetes.yml").string());
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
          labels["__meta_kubernetes_pod_annotation_" +
                 std::regex_replace(k, std::regex("[^a-zA-Z0-9]"), "_")] = v;
        }
        for (const auto& [k, v] : StringMap(pod["metadata"]["labels"])) {
          labels["__meta_kubernetes_pod_label_" +
                 std::regex_replace(k, std::regex("[^a-zA-Z0-9]"), "_")] = v;
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

}  // namespace
}  // namespace pipetrain::kubernetes_test
