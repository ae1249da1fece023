// A real Prometheus server (Debian's), started on loopback with deploy/prometheus's
// configuration and alert rules, scrapes a real coordinator and two workers while a real job
// runs. Every target is up, the alert rules load and evaluate without error, and every
// query the alert rules are built from, and every query of every Grafana dashboard panel
// (deploy/grafana/dashboards, its job_id variable set), returns data. promtool checks the
// configuration and the rules, and runs the rules' unit tests (deploy/prometheus/alerts_test.yml).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "client/daemon_process.h"
#include "runtime/base/subprocess.h"
#include "tests/daemons/local_cluster.h"

namespace {

namespace fs = std::filesystem;
using ::pipetrain::test::DaemonTest;
using ::pipetrain::test::Int64Of;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::pipetrain::test::Result;
using ::pipetrain::test::StateOf;

const fs::path kDeploy = fs::path(PIPETRAIN_SOURCE_DIR) / "deploy" / "prometheus";

// GET on the Prometheus HTTP API; the parsed JSON (null if no answer).
nlohmann::json Api(int port, const std::string& path, const httplib::Params& params = {}) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  auto res = client.Get(path, params, httplib::Headers());
  if (!res || res->status != 200) return nullptr;
  return nlohmann::json::parse(res->body, nullptr, /*allow_exceptions=*/false);
}

// The result vector of an instant query (empty if it failed).
nlohmann::json Query(int port, const std::string& promql) {
  const nlohmann::json j = Api(port, "/api/v1/query", {{"query", promql}});
  if (j.is_null() || j.value("status", "") != "success") return nlohmann::json::array();
  return j["data"]["result"];
}

const fs::path kDashboards = fs::path(PIPETRAIN_SOURCE_DIR) / "deploy" / "grafana" / "dashboards";

// Every dashboard of deploy/grafana/dashboards, parsed.
std::vector<nlohmann::json> Dashboards() {
  std::vector<nlohmann::json> out;
  for (const auto& entry : fs::directory_iterator(kDashboards)) {
    if (entry.path().extension() == ".json") {
      out.push_back(nlohmann::json::parse(ReadFile(entry.path()), nullptr, false));
    }
  }
  return out;
}

class PrometheusTest : public DaemonTest {};

// The dashboards' structure: a stable, unique uid; a `datasource` variable every panel and
// query uses; a `job_id` variable where a panel filters by it; a unit and a place on every
// panel.
TEST_F(PrometheusTest, DashboardsHaveUniqueUidsADataSourceVariableAndAUnitOnEveryPanel) {
  const std::vector<nlohmann::json> dashboards = Dashboards();
  ASSERT_GE(dashboards.size(), 2u);
  std::set<std::string> uids;
  for (const nlohmann::json& d : dashboards) {
    ASSERT_FALSE(d.is_discarded());
    const std::string uid = d.value("uid", "");
    EXPECT_FALSE(uid.empty());
    EXPECT_TRUE(uids.insert(uid).second) << "uid twice: " << uid;
    std::set<std::string> variables;
    for (const auto& v : d["templating"]["list"]) variables.insert(v.value("name", ""));
    EXPECT_TRUE(variables.count("datasource")) << uid;
    std::set<int> ids;
    for (const auto& panel : d["panels"]) {
      const std::string where = uid + ": " + panel.value("title", "");
      EXPECT_TRUE(ids.insert(panel.value("id", -1)).second) << where;
      EXPECT_FALSE(panel["fieldConfig"]["defaults"].value("unit", "").empty()) << where;
      for (const char* key : {"x", "y", "w", "h"}) {
        EXPECT_TRUE(panel["gridPos"].contains(key)) << where << " gridPos." << key;
      }
      EXPECT_EQ(panel["datasource"].value("uid", ""), "${datasource}") << where;
      ASSERT_FALSE(panel["targets"].empty()) << where;
      for (const auto& target : panel["targets"]) {
        EXPECT_EQ(target["datasource"].value("uid", ""), "${datasource}") << where;
        const std::string expr = target.value("expr", "");
        if (expr.find("$job_id") != std::string::npos) {
          EXPECT_TRUE(variables.count("job_id")) << where;
        }
      }
    }
  }
}

TEST_F(PrometheusTest, PromtoolChecksTheConfigurationAndTheAlertRules) {
  LocalCluster cluster(dir_, 0);
  for (const std::string& command :
       {"promtool check config " + (kDeploy / "prometheus.yml").string(),
        "promtool check rules " + (kDeploy / "alerts.yml").string(),
        "cd " + kDeploy.string() + " && promtool test rules alerts_test.yml"}) {
    Result r = cluster.Shell(command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.out << r.err;
  }
}

TEST_F(PrometheusTest, ARealServerScrapesARunningJobAndEveryRuleQueryHasData) {
  LocalCluster cluster(dir_, 2);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  // The shipped configuration, scraping every second, its targets the test's daemons.
  std::string config = ReadFile(kDeploy / "prometheus.yml");
  config = std::regex_replace(config, std::regex("scrape_interval: \\d+s"), "scrape_interval: 1s");
  config = std::regex_replace(config, std::regex("evaluation_interval: \\d+s"),
                              "evaluation_interval: 1s");
  Write("prometheus.yml", config);
  fs::copy_file(kDeploy / "alerts.yml", dir_ / "alerts.yml");
  fs::create_directories(dir_ / "targets");
  const std::vector<std::string> targets = {cluster.CoordinatorMetricsAddress(),
                                            cluster.WorkerMetricsAddress(0),
                                            cluster.WorkerMetricsAddress(1)};
  for (const std::string& t : targets) ASSERT_FALSE(t.empty());
  Write("targets/local.json", nlohmann::json::array({{{"targets", targets}}}).dump());

  // A free port for its web API: bind 0, read it back, let go.
  int port = 0;
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
    close(fd);
  }
  const pid_t prometheus = pipetrain::client::SpawnDaemon(
      {"/usr/bin/prometheus", "--config.file=" + (dir_ / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(port)},
      (dir_ / "prometheus.log").string(), SIGKILL);
  ASSERT_GT(prometheus, 0);
  struct Stop {
    pid_t pid;
    ~Stop() { pipetrain::subprocess::Stop(pid, SIGTERM, absl::Seconds(5)); }
  } stop{prometheus};

  Result submitted = cluster.Cli(
      "submit --model gpt --d-model 32 --n-heads 4 --n-layers 2 --schedule 1f1b --stages 2 "
      "--microbatches 4 --microbatch-size 4 --steps 100000 --warmup-steps 100 "
      "--lr-decay cosine --clip-grad-norm 1.0 --eval-every 2 --eval-split 0.1");
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  ASSERT_FALSE(
      cluster.WaitForJob(id, [](const nlohmann::json& j) { return Int64Of(j, "step", -1) >= 3; })
          .is_null());

  // Every target up, then enough scrapes for a rate over them.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool up = false;
  while (!up && std::chrono::steady_clock::now() < deadline) {
    const nlohmann::json result = Query(port, "up == 1");
    up = result.size() == targets.size();
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_TRUE(up) << ReadFile(dir_ / "prometheus.log");
  std::this_thread::sleep_for(std::chrono::seconds(4));

  // The queries the alert rules are made of, each with data while the job runs.
  const std::string job = "job_id=\"" + id + "\"";
  for (const std::string& q : std::vector<std::string>{
           "max by (job_id) (pipetrain_stage_last_step_timestamp_seconds) and on (job_id) "
           "pipetrain_job_step",
           "max by (job_id) (rate(pipetrain_stage_step_duration_seconds_sum[5m]) / "
           "rate(pipetrain_stage_step_duration_seconds_count[5m]))",
           std::string("pipetrain_job_straggler_ratio{") + job + "}",
           std::string("sum(pipetrain_workers)"),
           std::string("pipetrain_workers_lost_total"),
           std::string("pipetrain_jobs{state=\"running\"} == 1"),
       }) {
    EXPECT_FALSE(Query(port, q).empty()) << q;
  }
  // Every rule loaded and evaluated without error; none fires for a healthy job (one may be
  // pending: a stage slowed by this busy machine for a few steps is what `for:` is there for).
  const nlohmann::json rules = Api(port, "/api/v1/rules");
  ASSERT_FALSE(rules.is_null());
  int checked = 0;
  for (const auto& group : rules["data"]["groups"]) {
    for (const auto& rule : group["rules"]) {
      ++checked;
      EXPECT_EQ(rule.value("health", ""), "ok") << rule.dump();
      EXPECT_NE(rule.value("state", ""), "firing") << rule.dump();
    }
  }
  EXPECT_EQ(checked, 3);
  // Every query of every dashboard panel, its variables set to this job, has data.
  int queries = 0;
  for (const nlohmann::json& d : Dashboards()) {
    for (const auto& panel : d["panels"]) {
      for (const auto& target : panel["targets"]) {
        const std::string expr =
            std::regex_replace(target.value("expr", ""), std::regex("\\$job_id"), id);
        ++queries;
        EXPECT_FALSE(Query(port, expr).empty())
            << d.value("uid", "") << ": " << panel.value("title", "") << ": " << expr;
      }
    }
  }
  EXPECT_GT(queries, 10);
  EXPECT_EQ(cluster.Cli("cancel " + id).exit_code, 0);
}

}  // namespace
