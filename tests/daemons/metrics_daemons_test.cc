// /metrics of real daemons while a real job runs and after it ends: every scrape passes
// `promtool check metrics` (Debian's prometheus package), the series a dashboard needs are
// there while it runs, and the counters agree with the job record once it succeeded (steps
// completed = the job's steps; samples and tokens = steps x per-step rows and tokens). A
// scrape of another path is 404; a metrics port already in use stops a daemon at start with
// a clear error; scraping many times a second does not disturb the job.
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "runtime/base/host_port.h"
#include "tests/daemons/local_cluster.h"

namespace {

using ::pipetrain::test::DaemonTest;
using ::pipetrain::test::Int64Of;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::pipetrain::test::Result;
using ::pipetrain::test::StateOf;
using ::testing::HasSubstr;

constexpr int kSteps = 200, kMicrobatches = 4, kMicrobatchSize = 4, kSeqLen = 16;

std::string Job() {
  return "model: {name: gpt, d_model: 32, n_heads: 4, n_layers: 2}\n"
         "data: {seq_len: 16}\nschedule: 1f1b\nstages: 2\nmicrobatches: 4\nmicrobatch_size: 4\n"
         "steps: 200\n";
}

// GET http://ADDRESS/PATH: status and body (status -1 if no answer).
std::pair<int, std::string> Get(const std::string& address, const std::string& path) {
  const pipetrain::HostPort host_port = pipetrain::ParseHostPort(address).value();
  httplib::Client client(host_port.host, host_port.port);
  client.set_connection_timeout(2);
  auto res = client.Get(path.c_str());
  if (!res) return {-1, ""};
  return {res->status, res->body};
}

// Every sample "series value" of a scrape, keyed by the series text.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

// The value of the one series of `name` whose labels include every `label="value"` given;
// NaN if none.
double Value(const std::map<std::string, double>& samples, const std::string& name,
             const std::vector<std::string>& labels = {}) {
  for (const auto& [series, value] : samples) {
    if (series.rfind(name + "{", 0) != 0 && series != name) continue;
    bool all = true;
    for (const std::string& l : labels) all = all && series.find(l) != std::string::npos;
    if (all) return value;
  }
  return std::nan("");
}

// `promtool check metrics` on `text`: exit status and output.
std::pair<int, std::string> Promtool(LocalCluster& cluster, const std::string& text,
                                     const std::string& file) {
  FILE* f = std::fopen(file.c_str(), "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  Result r = cluster.Shell("promtool check metrics < " + file);
  return {r.exit_code, r.out + r.err};
}

class MetricsDaemonsTest : public DaemonTest {};

TEST_F(MetricsDaemonsTest, EveryDaemonServesCheckedMetricsThatAgreeWithTheJob) {
  LocalCluster cluster(dir_, 2);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  const std::string coordinator = cluster.CoordinatorMetricsAddress();
  const std::string worker0 = cluster.WorkerMetricsAddress(0),
                    worker1 = cluster.WorkerMetricsAddress(1);
  ASSERT_FALSE(coordinator.empty());
  ASSERT_FALSE(worker0.empty());
  ASSERT_FALSE(worker1.empty());
  Result submitted = cluster.Cli("submit " + Write("job.yaml", Job()).string());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));

  // While it runs: the series the Job dashboard reads, scraped as often as a client likes.
  ASSERT_FALSE(
      cluster.WaitForJob(id, [](const nlohmann::json& j) { return Int64Of(j, "step", -1) >= 3; })
          .is_null());
  int scrapes = 0;
  bool saw_running_series = false;
  for (int i = 0; i < 200 && StateOf(cluster.JobStatus(id)) == "JOB_STATE_RUNNING"; ++i) {
    const auto [code, text] = Get(coordinator, "/metrics");
    ASSERT_EQ(code, 200);
    const auto [wcode, wtext] = Get(worker0, "/metrics");
    ASSERT_EQ(wcode, 200);
    ++scrapes;
    const auto c = Samples(text), w = Samples(wtext);
    if (!std::isnan(Value(c, "pipetrain_job_step", {"job_id=\"" + id + "\""})) &&
        !std::isnan(Value(c, "pipetrain_job_straggler_ratio", {"pp_stage=\"1\""})) &&
        !std::isnan(Value(w, "pipetrain_stage_action_info", {"job_id=\"" + id + "\""}))) {
      saw_running_series = true;
      EXPECT_EQ(Promtool(cluster, text, (dir_ / "c.txt").string()).first, 0);
      EXPECT_EQ(Promtool(cluster, wtext, (dir_ / "w.txt").string()).first, 0);
      EXPECT_EQ(Value(c, "pipetrain_jobs", {"state=\"running\""}), 1);
      EXPECT_EQ(Value(c, "pipetrain_workers", {"state=\"busy\""}), 2);
      break;
    }
  }
  EXPECT_TRUE(saw_running_series) << "after " << scrapes << " scrapes";

  const nlohmann::json job = cluster.WaitForJob(id, [](const nlohmann::json& j) {
    return StateOf(j) == "JOB_STATE_SUCCEEDED" || StateOf(j) == "JOB_STATE_FAILED";
  });
  ASSERT_EQ(StateOf(job), "JOB_STATE_SUCCEEDED") << job.dump();

  // After it: every daemon's scrape passes promtool; the counters agree with the job.
  const auto [ccode, ctext] = Get(coordinator, "/metrics");
  ASSERT_EQ(ccode, 200);
  const auto [cstatus, cout] = Promtool(cluster, ctext, (dir_ / "coordinator.txt").string());
  EXPECT_EQ(cstatus, 0) << cout << ctext;
  const auto c = Samples(ctext);
  EXPECT_EQ(Value(c, "pipetrain_jobs", {"state=\"succeeded\""}), 1);
  EXPECT_EQ(Value(c, "pipetrain_workers", {"state=\"idle\""}), 2);
  EXPECT_GT(Value(c, "pipetrain_rpc_duration_seconds_count",
                  {"method=\"/pipetrain.v1.CoordinatorService/ReportSteps\"", "code=\"OK\""}),
            0);
  EXPECT_EQ(Value(c, "pipetrain_build_info", {"daemon=\"coordinator\""}), 1);
  int last_stages = 0;
  for (const std::string& worker : {worker0, worker1}) {
    const auto [code, text] = Get(worker, "/metrics");
    ASSERT_EQ(code, 200);
    const auto [status, out] = Promtool(cluster, text, (dir_ / "worker.txt").string());
    EXPECT_EQ(status, 0) << out << text;
    const auto w = Samples(text);
    const std::vector<std::string> job_label = {"job_id=\"" + id + "\""};
    EXPECT_EQ(Value(w, "pipetrain_stage_steps_total", job_label), kSteps) << text;
    EXPECT_EQ(Value(w, "pipetrain_stage_samples_total", job_label),
              kSteps * kMicrobatches * kMicrobatchSize);
    EXPECT_EQ(Value(w, "pipetrain_stage_tokens_total", job_label),
              kSteps * kMicrobatches * kMicrobatchSize * kSeqLen);
    EXPECT_EQ(Value(w, "pipetrain_stage_step_duration_seconds_count", job_label), kSteps - 1);
    EXPECT_GT(Value(w, "pipetrain_stage_compute_seconds_total", {"phase=\"forward\""}), 0);
    EXPECT_GT(Value(w, "pipetrain_worker_memory_bytes", {"kind=\"peak\""}), 0);
    // No fault: no survivors' state held.
    EXPECT_EQ(Value(w, "pipetrain_worker_memory_bytes", {"kind=\"held_state\""}), 0) << text;
    // The rank's tensors, counted at the allocator: its weights at least, and at its peak
    // more than it holds between jobs.
    const double tensors_peak =
        Value(w, "pipetrain_worker_memory_bytes", {"kind=\"tensors_peak\""});
    EXPECT_GT(tensors_peak, 0) << text;
    EXPECT_GE(tensors_peak, Value(w, "pipetrain_worker_memory_bytes", {"kind=\"tensors\""}));
    // Each stage sent as many activation bytes as the other received, and back for gradients.
    const bool last = !std::isnan(Value(w, "pipetrain_stage_loss", job_label));
    last_stages += last;
    const double sent = Value(w, "pipetrain_stage_sent_bytes_total",
                              {last ? "kind=\"gradient\"" : "kind=\"activation\""});
    EXPECT_GT(sent, 0);
    // An activation of b x T x d floats per micro-batch: 4 x 16 x 32 x 4 bytes.
    if (!last) {
      EXPECT_EQ(sent, kSteps * kMicrobatches * kMicrobatchSize * kSeqLen * 32 * 4.0);
    }
    if (last) {
      EXPECT_NEAR(Value(w, "pipetrain_stage_loss", job_label), job.value("loss", 0.0), 1e-6);
    }
  }
  EXPECT_EQ(last_stages, 1);

  // `pipetrain metrics`: the breakdown the step reports carried to the coordinator. Its
  // parts (forward, backward, optimizer, receives, sends) add up to each rank's whole time,
  // which the executor totals separately (compute_s + wait_s in the job record); each part
  // equals the worker's own counter.
  Result table = cluster.Cli("metrics " + id);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("ms per step"));
  Result breakdown = cluster.Cli("metrics " + id + " -o json");
  ASSERT_EQ(breakdown.exit_code, 0) << breakdown.err;
  const nlohmann::json stages = nlohmann::json::parse(breakdown.out)["stages"];
  ASSERT_EQ(stages.size(), 2u);
  for (size_t rank = 0; rank < stages.size(); ++rank) {
    SCOPED_TRACE(rank);
    const nlohmann::json& s = stages[rank];
    ASSERT_EQ(s.value("steps", 0), kSteps);
    EXPECT_THAT(table.out, HasSubstr(s.value("worker", "?")));
    double whole = 0;
    for (const char* part : {"forward", "backward", "optimizer", "recv_act", "recv_grad", "send"}) {
      whole += s["ms_per_step"].value(part, -1.0) * kSteps / 1e3;
    }
    const nlohmann::json& record = job["stage_status"][rank];
    const double total = record.value("compute_s", 0.0) + record.value("wait_s", 0.0);
    EXPECT_NEAR(whole, total, 1e-6 * total);
    EXPECT_GT(s.value("last_step_s", 0.0), 0);
    EXPECT_GT(s.value("straggler_ratio", 0.0), 0);
    int counted = 0;  // workers whose counters hold this rank
    for (const std::string& worker : {worker0, worker1}) {
      const auto w = Samples(Get(worker, "/metrics").second);
      const std::string stage = "pp_stage=\"" + std::to_string(s.value("stage", -1)) + "\"";
      const double forward = Value(w, "pipetrain_stage_compute_seconds_total",
                                   {"job_id=\"" + id + "\"", stage, "phase=\"forward\""});
      if (std::isnan(forward)) continue;  // the other worker's rank
      ++counted;
      EXPECT_NEAR(s["ms_per_step"].value("forward", -1.0) * kSteps / 1e3, forward, 1e-6 * forward);
    }
    EXPECT_EQ(counted, 1);
  }

  // Another path: 404 with a hint.
  const auto [missing, body] = Get(worker0, "/metric");
  EXPECT_EQ(missing, 404);
  EXPECT_THAT(body, HasSubstr("/metrics"));
}

TEST_F(MetricsDaemonsTest, AMetricsPortInUseIsAClearErrorAtStart) {
  LocalCluster cluster(dir_, 1);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1));
  const std::string taken = cluster.WorkerMetricsAddress(0);
  ASSERT_FALSE(taken.empty());
  Result worker =
      cluster.Shell(std::string(LocalCluster::worker_path()) + " --coordinator " +
                    cluster.address() + " --metrics-listen " + taken + " --register-timeout 5");
  EXPECT_EQ(worker.exit_code, 5);
  EXPECT_THAT(worker.err, HasSubstr("--metrics-listen " + taken + ": cannot listen there"));
  Result coordinator =
      cluster.Shell(std::string(LocalCluster::coordinator_path()) + " --listen 127.0.0.1:0 --db " +
                    (dir_ / "other.db").string() + " --metrics-listen " + taken);
  EXPECT_EQ(coordinator.exit_code, 5);
  EXPECT_THAT(coordinator.err, HasSubstr("is the port in use?"));
  // The first worker serves on, undisturbed.
  EXPECT_EQ(Get(taken, "/metrics").first, 200);
}

}  // namespace
