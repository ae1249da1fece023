// The Prometheus text exposition (metrics/metrics.h): the format rules promtool does not
// check (buckets increasing and cumulative, +Inf equal to _count even under concurrent
// updates, each series once, escaping), the naming rules, and promtool's own check of the
// output (Debian's prometheus package). The endpoint (metrics/http_server.h): 200 on
// /metrics, 404 elsewhere, a port in use refused at start.
#include <atomic>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "metrics/http_server.h"
#include "metrics/metrics.h"

namespace pipetrain::metrics {
namespace {

using ::testing::HasSubstr;

// Every sample line "name{labels} value" of a rendering, in order.
std::vector<std::pair<std::string, std::string>> Samples(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out.push_back({line.substr(0, space), line.substr(space + 1)});
  }
  return out;
}

// Runs `promtool check metrics` on `text`; returns its output and exit status.
std::pair<int, std::string> Promtool(const std::string& text) {
  char path[] = "/tmp/pipetrain-metrics-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return {-1, "mkstemp"};
  FILE* f = fdopen(fd, "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  FILE* p = popen((std::string("promtool check metrics < ") + path + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  std::remove(path);
  return {status, out};
}

TEST(Metrics, CountersGaugesAndHistogramsRenderAsTheFormatSays) {
  Registry r;
  r.GetCounter("pipetrain_steps_total", "Steps completed.", {"job_id", "pp_stage"},
               {"job-0001", "0"}).Add(3);
  r.GetCounter("pipetrain_steps_total", "Steps completed.", {"job_id", "pp_stage"},
               {"job-0001", "0"}).Add(2);  // the same series again
  r.GetGauge("pipetrain_bubble_ratio", "Idle share of the last step.", {}, {}).Set(0.25);
  Histogram& h = r.GetHistogram("pipetrain_step_duration_seconds", "Step time.", {"pp_stage"},
                                {"1"}, {0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 100.0}) h.Observe(v);
  const std::string text = r.Render();
  EXPECT_EQ(text,
            "# HELP pipetrain_bubble_ratio Idle share of the last step.\n"
            "# TYPE pipetrain_bubble_ratio gauge\n"
            "pipetrain_bubble_ratio 0.25\n"
            "# HELP pipetrain_step_duration_seconds Step time.\n"
            "# TYPE pipetrain_step_duration_seconds histogram\n"
            "pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"0.1\"} 2\n"
            "pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"1\"} 3\n"
            "pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"10\"} 4\n"
            "pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"+Inf\"} 5\n"
            "pipetrain_step_duration_seconds_sum{pp_stage=\"1\"} 102.65\n"
            "pipetrain_step_duration_seconds_count{pp_stage=\"1\"} 5\n"
            "# HELP pipetrain_steps_total Steps completed.\n"
            "# TYPE pipetrain_steps_total counter\n"
            "pipetrain_steps_total{job_id=\"job-0001\",pp_stage=\"0\"} 5\n");
  const auto [status, out] = Promtool(text);
  EXPECT_EQ(status, 0) << out;
}

// +Inf equals _count and buckets never decrease, in every rendering taken while other
// threads observe; each series appears once.
TEST(Metrics, HistogramsStayConsistentUnderConcurrentUpdates) {
  Registry r;
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      Histogram& h = r.GetHistogram("pipetrain_wait_seconds", "Waits.", {"pp_stage"},
                                    {std::to_string(t % 2)}, SecondsBuckets());
      Counter& c = r.GetCounter("pipetrain_sent_bytes_total", "Bytes.", {"pp_stage"},
                                {std::to_string(t % 2)});
      for (uint64_t i = 0; !stop; ++i) {
        h.Observe(static_cast<double>(i % 1000) / 100.0);
        c.Add(8);
      }
    });
  }
  for (int round = 0; round < 200; ++round) {
    const std::string text = r.Render();
    std::map<std::string, int> seen;
    std::map<std::string, double> last_bucket, inf, count;
    for (const auto& [series, value] : Samples(text)) {
      EXPECT_EQ(++seen[series], 1) << "twice: " << series;
      std::smatch m;
      static const std::regex bucket(R"re(pipetrain_wait_seconds_bucket\{pp_stage="(\d)",le="([^"]+)"\})re");
      if (std::regex_match(series, m, bucket)) {
        const double v = std::stod(value);
        EXPECT_GE(v, last_bucket[m[1]]) << "buckets decrease: " << series;
        last_bucket[m[1]] = v;
        if (m[2] == "+Inf") inf[m[1]] = v;
      }
      static const std::regex total(R"re(pipetrain_wait_seconds_count\{pp_stage="(\d)"\})re");
      if (std::regex_match(series, m, total)) count[m[1]] = std::stod(value);
    }
    for (const auto& [stage, c] : count) EXPECT_EQ(inf[stage], c) << "stage " << stage;
  }
  stop = true;
  for (auto& w : writers) w.join();
  const auto [status, out] = Promtool(r.Render());
  EXPECT_EQ(status, 0) << out;
}

TEST(Metrics, LabelValuesAndHelpAreEscaped) {
  Registry r;
  r.GetGauge("pipetrain_info", "A \\ backslash\nand a newline.", {"name"},
             {"a \"quoted\" \\ name\nwith a newline"}).Set(1);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP pipetrain_info A \\\\ backslash\\nand a newline.\n"));
  EXPECT_THAT(text,
              HasSubstr("pipetrain_info{name=\"a \\\"quoted\\\" \\\\ name\\nwith a newline\"} 1\n"));
  const auto [status, out] = Promtool(text);
  EXPECT_EQ(status, 0) << out;
}

TEST(Metrics, NamesAndLabelsFollowPrometheusRules) {
  Registry r;
  EXPECT_THROW(r.GetGauge("9lives", "", {}, {}), std::invalid_argument);
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"job"}, {"a"}), std::invalid_argument);
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"instance"}, {"a"}), std::invalid_argument);
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"__reserved"}, {"a"}), std::invalid_argument);
  EXPECT_THROW(r.GetCounter("pipetrain_steps", "", {}, {}), std::invalid_argument);  // _total
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"a"}, {}), std::invalid_argument);  // arity
  r.GetGauge("pipetrain_x", "", {"a"}, {"1"});
  EXPECT_THROW(r.GetCounter("pipetrain_x", "", {"a"}, {"1"}), std::invalid_argument);  // type
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"b"}, {"1"}), std::invalid_argument);  // labels
  EXPECT_THROW(Histogram({1, 1}), std::invalid_argument);
  EXPECT_THROW(Histogram({2, 1}), std::invalid_argument);
  EXPECT_EQ(FormatValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatValue(0.0 / 0.0), "NaN");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(std::stod(FormatValue(1.0 / 3)), 1.0 / 3);
}

TEST(Metrics, SeriesOfAFinishedJobGoAndCollectorsAreReadAtScrapeTime) {
  Registry r;
  r.GetCounter("pipetrain_steps_total", "Steps.", {"job_id"}, {"job-0001"}).Add(1);
  r.GetCounter("pipetrain_steps_total", "Steps.", {"job_id"}, {"job-0002"}).Add(1);
  r.RemoveSeriesWith("job_id", "job-0001");
  EXPECT_THAT(r.Render(), ::testing::Not(HasSubstr("job-0001")));
  EXPECT_THAT(r.Render(), HasSubstr("job-0002"));
  std::atomic<int> calls{0};
  const int id = r.AddCollector("pipetrain_jobs", "Jobs by state.", {"state"}, [&] {
    ++calls;
    return std::vector<CollectedSample>{{{"running"}, 2}, {{"queued"}, 0}};
  });
  EXPECT_THAT(r.Render(), HasSubstr("pipetrain_jobs{state=\"running\"} 2\n"));
  EXPECT_EQ(calls.load(), 1);
  r.RemoveCollector(id);
  EXPECT_THAT(r.Render(), ::testing::Not(HasSubstr("pipetrain_jobs")));
}

TEST(MetricsServer, ServesMetricsAnswers404ElsewhereAndRefusesAPortInUse) {
  Registry r;
  r.GetGauge("pipetrain_up", "Serving.", {}, {}).Set(1);
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start("127.0.0.1:0", &r);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  httplib::Client client("127.0.0.1", port);
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(metrics->body, HasSubstr("pipetrain_up 1\n"));
  auto other = client.Get("/metric");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_THAT(other->body, HasSubstr("metrics are at /metrics"));
  absl::StatusOr<std::unique_ptr<MetricsServer>> second = MetricsServer::Start(address, &r);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("is the port in use?"));
  EXPECT_FALSE(MetricsServer::Start("nonsense", &r).ok());
  EXPECT_FALSE(MetricsServer::Start("127.0.0.1:70000", &r).ok());
}

}  // namespace
}  // namespace pipetrain::metrics
