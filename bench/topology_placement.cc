// Topology-aware placement against placement in registration order, on hosts whose links
// between them are slower than within (docs/planning.md "Hosts"), with the planner's
// prediction of each beside the measured step.
//
// Three hosts as network namespaces (tests/multihost/namespace_hosts.h; root only, else it
// exits 77 saying why): the coordinator on host 0, two workers on each of hosts 1 and 2,
// registered host by host. What hosts 1 and 2 send each other is shaped by tbf to --rate
// (default 200mbit); within a host, ranks talk over its loopback.
//   1. `pipetrain profile-link` measures the shaped link between hosts 1 and 2.
//   2. Rounds, each: `pipetrain plan --predict --no-cache --hosts 2,2 --host-links` profiles
//      the model afresh and predicts the job's step on each placement (pipelines together,
//      stages together); then, alternating which goes first, a fresh coordinator with
//      --placement in-order and one with --placement topology, the same four workers
//      started again each time; the job runs to its end and its step_time_s (the median of
//      rank 0's step-to-step times) is read back, with where its ranks ran. A profile taken
//      at another time would carry that time's speed of this machine (it swings by tens of
//      percent), so each round's prediction is set against its own measurements.
// The job: an MLP of 3 x 1024 hidden units in 2 stages (the first holding 2.1 M parameters,
// the second 10 K) x 2 replicas, 1F1B with 4 micro-batches of 8: its large traffic is stage
// 0's gradient AllReduce, its stage boundary carries 32 KiB a micro-batch. In registration
// order each replica's stages share a host and stage 0's AllReduce crosses the slow link;
// topology-aware, each stage's replicas share one.
//
//   sudo build/bench/topology_placement [--rate 200mbit] [--rounds 3] [--steps 30]
//
// Prints a markdown table: per placement the median measured step, the median prediction,
// the median of the rounds' prediction errors, and the median of the rounds' paired ratios
// (in-order / topology).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/multihost/namespace_hosts.h"

namespace pipetrain::bench {
namespace {

namespace fs = std::filesystem;
using test::NamespaceHosts;

constexpr int kCoordinatorHost = 0;
constexpr int kWorkerHosts[] = {1, 2};
constexpr int kWorkersPerHost = 2;

struct Options {
  std::string rate = "200mbit";
  int rounds = 3;
  int steps = 30;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

class Bench {
 public:
  Bench(NamespaceHosts& hosts, fs::path dir, Options options)
      : hosts_(hosts), dir_(std::move(dir)), options_(std::move(options)) {}

  fs::path WriteJob() {
    const fs::path file = dir_ / "job.yaml";
    std::ofstream(file) << "model: {name: mlp, input_dim: 32, hidden: 1024, hidden_layers: 3, "
                           "num_classes: 10}\n"
                        << "data: {kind: classification, num_samples: 4096}\n"
                        << "schedule: 1f1b\nstages: [[0, 3], [3, 4]]\nreplicas: 2\n"
                        << "microbatches: 4\nmicrobatch_size: 8\nsteps: " << options_.steps
                        << "\nthreads_per_stage: 1\ntimeout_s: 120\n";
    return file;
  }

  // The links between hosts 1 and 2, measured across the shaped link; "" if it failed.
  std::string MeasureLinks() {
    const fs::path out = dir_ / "host-links.json";
    const std::string leader = hosts_.DataAddress(1);
    absl::StatusOr<pid_t> listening =
        hosts_.Start(1,
                     {PIPETRAIN_CLI, "profile-link", "--listen", leader, "--port", "29700",
                      "--output", out.string()},
                     dir_ / "profile-link-leader.log");
    if (!listening.ok()) return "";
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const NamespaceHosts::Ran peer =
        hosts_.Run(2, {PIPETRAIN_CLI, "profile-link", "--connect", leader + ":29700", "--address",
                       hosts_.DataAddress(2)});
    for (int i = 0; i < 100 && !fs::exists(out); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (peer.exit_code != 0 || !fs::exists(out)) return "";
    return out.string();
  }

  // The planner's prediction of the job on each placement: placement name -> seconds.
  std::map<std::string, double> Predict(const fs::path& job, const std::string& links) {
    const NamespaceHosts::Ran ran = hosts_.Run(
        kCoordinatorHost, {PIPETRAIN_CLI, "plan", job.string(), "--predict", "--no-cache",
                           "--hosts", "2,2", "--host-links", links, "-o", "json", "-q"});
    std::map<std::string, double> out;
    const nlohmann::json j = nlohmann::json::parse(ran.out, nullptr, false);
    if (ran.exit_code != 0 || !j.is_object() || !j.contains("placements")) {
      std::fprintf(stderr, "topology_placement: plan --predict failed (%d): %s\n", ran.exit_code,
                   ran.out.c_str());
      return out;
    }
    for (const nlohmann::json& p : j["placements"]) {
      out[p.value("placement", "")] = p.value("predicted_step_time_s", 0.0);
    }
    return out;
  }

  struct Run {
    double step_time_s = 0;
    std::string rank_hosts;  // e.g. "1,1,2,2"
  };

  // One job under a fresh coordinator with `placement` and four fresh workers.
  absl::StatusOr<Run> RunOnce(const std::string& placement, const fs::path& job,
                              const std::string& links, int index) {
    const std::string coordinator = hosts_.DataAddress(kCoordinatorHost) + ":7070";
    const std::string tag = absl::StrCat(placement, "-", index);
    absl::StatusOr<pid_t> started =
        hosts_.Start(kCoordinatorHost,
                     {PIPETRAIN_COORDINATOR, "--listen", "0.0.0.0:7070", "--db",
                      (dir_ / (tag + ".db")).string(), "--heartbeat-ms", "500", "--metrics-listen",
                      "", "--placement", placement, "--host-links", links},
                     dir_ / (tag + "-coordinator.log"));
    if (!started.ok()) return started.status();
    int registered = 0;
    for (const int host : kWorkerHosts) {
      for (int w = 0; w < kWorkersPerHost; ++w) {
        absl::StatusOr<pid_t> worker =
            hosts_.Start(host,
                         {PIPETRAIN_WORKER, "--coordinator", coordinator, "--metrics-listen", "",
                          "--register-timeout", "30", "--host-name", absl::StrCat("host", host),
                          "--iface", "eth0"},
                         dir_ / absl::StrCat(tag, "-worker-", host, "-", w, ".log"));
        if (!worker.ok()) return worker.status();
        // One at a time, so that registration order is host by host.
        if (!WaitForWorkers(coordinator, ++registered)) {
          return absl::DeadlineExceededError(
              absl::StrCat("worker ", registered, " did not register within 60 s"));
        }
      }
    }
    const NamespaceHosts::Ran submitted = hosts_.Run(
        kCoordinatorHost,
        {PIPETRAIN_CLI, "submit", job.string(), "--follow", "--coordinator", coordinator});
    Run run;
    std::map<std::string, std::string> worker_host;
    for (const nlohmann::json& w : Lines(coordinator, {"workers", "-o", "json"})) {
      worker_host[w.value("id", "")] = w.value("host", "");
    }
    const std::vector<nlohmann::json> jobs = Lines(coordinator, {"list", "-o", "json"});
    for (int host = 0; host < 3; ++host) hosts_.KillHost(host);
    if (submitted.exit_code != 0 || jobs.empty()) {
      return absl::InternalError(
          absl::StrCat("the job under --placement ", placement, " failed: ", submitted.out));
    }
    const nlohmann::json& j = jobs.back();
    run.step_time_s = j.value("stepTimeS", j.value("step_time_s", 0.0));
    std::vector<std::string> hosts_of_ranks;
    const nlohmann::json stages = j.contains("stageStatus") ? j["stageStatus"] : j["stage_status"];
    for (const nlohmann::json& s : stages) {
      const std::string id = s.value("workerId", s.value("worker_id", ""));
      hosts_of_ranks.push_back(worker_host[id]);
    }
    run.rank_hosts = absl::StrJoin(hosts_of_ranks, ",");
    return run;
  }

 private:
  std::vector<nlohmann::json> Lines(const std::string& coordinator, std::vector<std::string> args) {
    std::vector<std::string> argv = {PIPETRAIN_CLI};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--coordinator", coordinator});
    std::vector<nlohmann::json> out;
    for (absl::string_view line : absl::StrSplit(hosts_.Run(kCoordinatorHost, argv).out, '\n')) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object()) out.push_back(std::move(j));
    }
    return out;
  }
  bool WaitForWorkers(const std::string& coordinator, int n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (static_cast<int>(Lines(coordinator, {"workers", "-o", "json"}).size()) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  NamespaceHosts& hosts_;
  const fs::path dir_;
  const Options options_;
};

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rate") {
      options.rate = value;
    } else if (flag == "--rounds" && absl::SimpleAtoi(value, &options.rounds)) {
    } else if (flag == "--steps" && absl::SimpleAtoi(value, &options.steps)) {
    } else {
      std::fprintf(stderr,
                   "usage: topology_placement [--rate 200mbit] [--rounds 3] [--steps 30]\n");
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<NamespaceHosts>> hosts = NamespaceHosts::Create(3);
  if (!hosts.ok()) {
    std::fprintf(stderr, "topology_placement: skipped: no hosts as network namespaces: %s\n",
                 std::string(hosts.status().message()).c_str());
    return 77;
  }
  for (const int host : kWorkerHosts) {
    if (absl::Status s = (*hosts)->Shape(host, "eth0", options.rate); !s.ok()) {
      std::fprintf(stderr, "topology_placement: cannot shape host %d's link: %s\n", host,
                   std::string(s.message()).c_str());
      return 1;
    }
  }
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("pipetrain-topology-", getpid());
  fs::create_directories(dir);
  Bench bench(**hosts, dir, options);
  const fs::path job = bench.WriteJob();
  const std::string links = bench.MeasureLinks();
  if (links.empty()) {
    std::fprintf(stderr, "topology_placement: profile-link failed (logs in %s)\n", dir.c_str());
    return 1;
  }
  std::ifstream links_in(links);
  const std::string links_json((std::istreambuf_iterator<char>(links_in)),
                               std::istreambuf_iterator<char>());
  std::fprintf(stderr, "links between hosts (%s): %s", options.rate.c_str(), links_json.c_str());
  // The placement each policy took, named as the planner names them.
  const std::map<std::string, std::string> as_planned = {{"in-order", "pipelines together"},
                                                         {"topology", "stages together"}};
  const std::vector<std::string> placements = {"in-order", "topology"};
  std::map<std::string, std::vector<double>> steps, predictions, errors;
  std::map<std::string, std::string> where;
  std::vector<double> ratios;
  for (int round = 0; round < options.rounds; ++round) {
    const std::map<std::string, double> predicted = bench.Predict(job, links);
    // A rest after profiling too: without it, the runs right after a profile were the slow
    // ones (docs/performance.md, "Placement on hosts").
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::map<std::string, double> this_round;
    for (int k = 0; k < 2; ++k) {
      const std::string& placement = placements[(round + k) % 2];
      absl::StatusOr<Bench::Run> run = bench.RunOnce(placement, job, links, round);
      if (!run.ok()) {
        std::fprintf(stderr, "topology_placement: %s (logs in %s)\n",
                     std::string(run.status().message()).c_str(), dir.c_str());
        return 1;
      }
      const auto p = predicted.find(as_planned.at(placement));
      const double prediction = p == predicted.end() ? 0 : p->second;
      std::fprintf(stderr, "round %d %-9s step %.1f ms (predicted %.1f ms), ranks on %s\n", round,
                   placement.c_str(), run->step_time_s * 1e3, prediction * 1e3,
                   run->rank_hosts.c_str());
      steps[placement].push_back(run->step_time_s);
      if (prediction > 0 && run->step_time_s > 0) {
        predictions[placement].push_back(prediction);
        errors[placement].push_back(prediction / run->step_time_s - 1);
      }
      where[placement] = run->rank_hosts;
      this_round[placement] = run->step_time_s;
      std::this_thread::sleep_for(std::chrono::seconds(2));  // a rest between runs
    }
    ratios.push_back(this_round["in-order"] / this_round["topology"]);
  }
  std::printf(
      "| placement | ranks on hosts (rank 0..3) | measured step (median of %d) | "
      "predicted (median) | prediction error (median of the rounds') |\n"
      "|---|---|---|---|---|\n",
      options.rounds);
  for (const std::string& placement : placements) {
    if (errors[placement].empty()) {
      std::fprintf(stderr, "topology_placement: no prediction for %s\n", placement.c_str());
      return 1;
    }
    std::printf("| %s (%s) | %s | %.1f ms | %.1f ms | %+.0f%% |\n", placement.c_str(),
                as_planned.at(placement).c_str(), where[placement].c_str(),
                Median(steps[placement]) * 1e3, Median(predictions[placement]) * 1e3,
                100 * Median(errors[placement]));
  }
  std::printf(
      "\nin-order / topology step time, median of %d paired ratios: %.2fx (links between "
      "hosts shaped to %s)\n",
      options.rounds, Median(ratios), options.rate.c_str());
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) { return pipetrain::bench::Main(argc, argv); }
