#include "runtime/job/report/trace.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "runtime/base/rank_layout.h"
#include "runtime/schedule/action.h"

namespace pipetrain::job {

std::string ChromeTraceJson(const JobReport& report) {
  double origin = std::numeric_limits<double>::infinity();
  for (const auto& st : report.stage_stats) {
    if (!st.records.empty()) origin = std::min(origin, st.records.front().start_s);
  }
  auto us = [origin](double s) { return (s - origin) * 1e6; };

  nlohmann::json events = nlohmann::json::array();
  const int p = std::max(report.stages, 1);
  for (size_t i = 0; i < report.stage_stats.size(); ++i) {
    const RankLayout layout{p, report.replicas};
    const int replica = layout.ReplicaOf(static_cast<int>(i)),
              stage = layout.StageOf(static_cast<int>(i));
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", replica},
                      {"tid", 0},
                      {"args", {{"name", absl::StrCat("replica ", replica)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", replica},
                      {"tid", stage},
                      {"args", {{"name", absl::StrCat("stage ", stage)}}}});
    const executor::StageStats& st = report.stage_stats[i];
    for (const auto& r : st.records) {
      nlohmann::json args = {{"wait_ms", r.wait_s * 1e3}};
      if (r.version >= 0) args["weight_version"] = r.version;
      events.push_back({{"ph", "X"},
                        {"name", schedule::ToString(r.action)},
                        {"cat", "action"},
                        {"pid", replica},
                        {"tid", stage},
                        {"ts", us(r.start_s)},
                        {"dur", us(r.end_s) - us(r.start_s)},
                        {"args", args}});
    }
    for (const auto& a : st.allreduces) {
      events.push_back(
          {{"ph", "X"},
           {"name", a.bucket >= 0 ? absl::StrCat("ALLREDUCE", a.step, " bucket ", a.bucket)
                                  : absl::StrCat("ALLREDUCE", a.step)},
           {"cat", "allreduce"},
           {"pid", replica},
           // A thread of its own under the stage: it overlaps the actions.
           {"tid", p + stage},
           {"ts", us(a.start_s)},
           {"dur", us(a.end_s) - us(a.start_s)},
           {"args", {{"step", a.step}}}});
    }
    if (!st.allreduces.empty()) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", replica},
                        {"tid", p + stage},
                        {"args", {{"name", absl::StrCat("stage ", stage, " allreduce")}}}});
    }
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace pipetrain::job
