// deploy/kubernetes/'s manifests as the real `kubectl kustomize` renders every overlay: all
// the objects the deployment needs, in one namespace; selectors against labels, Service
// ports against container ports; probe, scrape and peer ports against the ports the daemons'
// flags open, and the token from the Secret; GPUs only in the gpu overlay's worker limits.
// deploy/prometheus's Kubernetes configuration is tested in kubernetes_prometheus_test.cc,
// the containers' command lines in kubernetes_containers_test.cc (one binary); the helpers
// are in kubernetes_fixture.h.
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "tests/deploy/kubernetes_fixture.h"

namespace pipetrain::kubernetes_test {
namespace {

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
    for (const char* want : {"Namespace/pipetrain", "Service/pipetrain-coordinator",
                             "Service/pipetrain-worker", "StatefulSet/pipetrain-coordinator",
                             "StatefulSet/pipetrain-worker", "Job/pipetrain-submit"}) {
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
      ASSERT_EQ(selected.size(), 1u)
          << KindName(service) << " selects " << selected.size() << " workloads";
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
    EXPECT_EQ(
        (*Find(objects, "Service", "pipetrain-worker"))["spec"]["clusterIP"].as<std::string>(""),
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
          // A worker is ready once registered, alive while its server answers (it may wait
          // minutes for the coordinator to start).
          const bool readiness = std::string(probe) == "readinessProbe";
          EXPECT_EQ(At(c, {probe, "grpc", "service"}).as<std::string>(""),
                    command == "pipetrain-worker" && readiness ? "pipetrain.v1.WorkerService" : "")
              << probe;
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
          EXPECT_EQ(Flag(c, "--advertise-address"), "$(POD_IP)");
          bool pod_ip = false;
          for (const YAML::Node& e : c["env"]) {
            pod_ip |=
                e["name"].as<std::string>() == "POD_IP" &&
                At(e, {"valueFrom", "fieldRef", "fieldPath"}).as<std::string>("") == "status.podIP";
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

}  // namespace
}  // namespace pipetrain::kubernetes_test
