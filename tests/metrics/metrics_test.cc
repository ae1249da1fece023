// The daemons' metrics (metrics/metrics.h over prometheus-cpp): what the registry made is what
// the exposition shows, histograms consistent under concurrent updates (+Inf equal to _count,
// buckets never decreasing), each series once, escaping, the naming rules, series removed by
// label, collectors read at scrape time, and promtool's own check of the output (Debian's
// prometheus package). The endpoint that serves them is tested in endpoint_test.cc.

#include <atomic>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "metrics/metrics.h"
#include "tests/metrics/promtool.h"

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

// The samples the registry made are those the exposition shows, one family each, in name
// order, and promtool accepts the text.
TEST(Metrics, CountersGaugesAndHistogramsRenderAsTheFormatSays) {
  Registry r;
  r.GetCounter("pipetrain_steps_total", "Steps completed.", {"job_id", "pp_stage"},
               {"job-0001", "0"})
      .Increment(3);
  r.GetCounter("pipetrain_steps_total", "Steps completed.", {"job_id", "pp_stage"},
               {"job-0001", "0"})
      .Increment(2);  // the same series again
  r.GetCounter("pipetrain_steps_total", "Steps completed.", {"job_id", "pp_stage"},
               {"job-0001", "0"})
      .Increment(-7);  // a counter never goes down
  r.GetGauge("pipetrain_bubble_ratio", "Idle share of the last step.", {}, {}).Set(0.25);
  Histogram& h = r.GetHistogram("pipetrain_step_duration_seconds", "Step time.", {"pp_stage"},
                                {"1"}, {0.1, 1, 10});
  for (double v : {0.05, 0.1, 0.5, 2.0, 100.0}) h.Observe(v);
  const std::string text = r.Render();
  std::map<std::string, std::string> samples;
  for (const auto& [series, value] : Samples(text)) samples[series] = value;
  const std::map<std::string, std::string> expected = {
      {"pipetrain_bubble_ratio", "0.25"},
      {"pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"0.1\"}", "2"},
      {"pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"1\"}", "3"},
      {"pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"10\"}", "4"},
      {"pipetrain_step_duration_seconds_bucket{pp_stage=\"1\",le=\"+Inf\"}", "5"},
      {"pipetrain_step_duration_seconds_sum{pp_stage=\"1\"}", "102.65"},
      {"pipetrain_step_duration_seconds_count{pp_stage=\"1\"}", "5"},
      {"pipetrain_steps_total{job_id=\"job-0001\",pp_stage=\"0\"}", "5"},
  };
  EXPECT_EQ(samples, expected) << text;
  // One HELP and TYPE per family, in name order.
  std::vector<std::string> types;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) types.push_back(line);
  }
  EXPECT_EQ(types, (std::vector<std::string>{"# TYPE pipetrain_bubble_ratio gauge",
                                             "# TYPE pipetrain_step_duration_seconds histogram",
                                             "# TYPE pipetrain_steps_total counter"}));
  EXPECT_THAT(text, HasSubstr("# HELP pipetrain_steps_total Steps completed.\n"));
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
        c.Increment(8);
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
      static const std::regex bucket(
          R"re(pipetrain_wait_seconds_bucket\{pp_stage="(\d)",le="([^"]+)"\})re");
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
             {"a \"quoted\" \\ name\nwith a newline"})
      .Set(1);
  const std::string text = r.Render();
  EXPECT_THAT(text, HasSubstr("# HELP pipetrain_info A \\\\ backslash\\nand a newline.\n"));
  EXPECT_THAT(
      text, HasSubstr("pipetrain_info{name=\"a \\\"quoted\\\" \\\\ name\\nwith a newline\"} 1\n"));
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
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"a"}, {}), std::invalid_argument);     // arity
  r.GetGauge("pipetrain_x", "", {"a"}, {"1"});
  EXPECT_THROW(r.GetCounter("pipetrain_x", "", {"a"}, {"1"}), std::invalid_argument);  // type
  EXPECT_THROW(r.GetGauge("pipetrain_x", "", {"b"}, {"1"}), std::invalid_argument);    // labels
  EXPECT_THROW(r.GetHistogram("pipetrain_h", "", {}, {}, {1, 1}), std::invalid_argument);
  EXPECT_THROW(r.GetHistogram("pipetrain_h", "", {}, {}, {2, 1}), std::invalid_argument);
  EXPECT_THROW(r.GetHistogram("pipetrain_h", "", {}, {}, {1, 1.0 / 0.0}), std::invalid_argument);
  r.GetHistogram("pipetrain_h", "", {}, {}, {1, 2});
  EXPECT_THROW(r.GetHistogram("pipetrain_h", "", {}, {}, {1, 3}), std::invalid_argument);
  EXPECT_THROW(
      r.AddCollector("pipetrain_x", "", {"a"}, [] { return std::vector<CollectedSample>{}; }),
      std::invalid_argument);  // already a metric
  EXPECT_THROW(
      r.AddCollector("pipetrain_y", "", {"job"}, [] { return std::vector<CollectedSample>{}; }),
      std::invalid_argument);
}

TEST(Metrics, SeriesOfAFinishedJobGoAndCollectorsAreReadAtScrapeTime) {
  Registry r;
  r.GetCounter("pipetrain_steps_total", "Steps.", {"job_id"}, {"job-0001"}).Increment(1);
  r.GetCounter("pipetrain_steps_total", "Steps.", {"job_id"}, {"job-0002"}).Increment(1);
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

}  // namespace
}  // namespace pipetrain::metrics
