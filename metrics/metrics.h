// Prometheus metrics for the daemons, in the text exposition format 0.0.4 (what a Prometheus
// server scrapes from GET /metrics). Counters, gauges and histograms with fixed buckets.
//
// A series (a metric name with one set of label values) is made once, under the registry's
// lock, and then updated from any thread with atomics only: a stage's thread holding a
// Counter& never waits for a scrape or for another thread. Render() takes the lock to walk
// the series, never the atomics'. Collectors add series that are read at scrape time (a
// stage's current action, the number of jobs in each state) without any updates in between.
//
// Names and labels follow Prometheus's rules, checked when a series is made (a wrong one is
// a programming error: std::invalid_argument): names [a-zA-Z_:][a-zA-Z0-9_:]*, label names
// [a-zA-Z_][a-zA-Z0-9_]* not starting with "__" and never "job" or "instance" (the labels a
// Prometheus server adds to every series it scrapes); one name has one type, help text and
// label-name list. Label values and help text are escaped as the format requires.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pipetrain::metrics {

// Label values, in the order of the family's label names.
using LabelValues = std::vector<std::string>;

class Counter {
 public:
  void Add(double delta = 1);  // delta >= 0
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: strictly increasing, finite upper bounds; the +Inf bucket is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bucket (the last is +Inf, equal to the count), and the sum: read
  // together so that +Inf equals the count even while Observe() runs elsewhere.
  struct Snapshot {
    std::vector<uint64_t> cumulative;
    double sum = 0;
  };
  Snapshot Read() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket, not cumulative; +Inf last
  std::atomic<double> sum_{0};
};

// Buckets for durations in seconds: 1 ms .. 60 s, about 2.5x apart.
std::vector<double> SecondsBuckets();

// One sample a collector adds at scrape time.
struct CollectedSample {
  LabelValues labels;
  double value = 0;
};

class Registry {
 public:
  enum class Type { kCounter, kGauge, kHistogram };

  // The series of `name` with these label values, made on first use. Every call for one
  // name must give the same help, label names (and for histograms, bounds).
  Counter& GetCounter(const std::string& name, const std::string& help,
                      const std::vector<std::string>& label_names, const LabelValues& values);
  Gauge& GetGauge(const std::string& name, const std::string& help,
                  const std::vector<std::string>& label_names, const LabelValues& values);
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names,
                          const LabelValues& values, const std::vector<double>& bounds);

  // Removes every series (of every family) whose label `label_name` is `value`: a finished
  // job's or a departed worker's. References to them must no longer be used.
  void RemoveSeriesWith(const std::string& label_name, const std::string& value);

  // A family whose samples `collect` returns at each scrape (a gauge, or a counter whose
  // source only grows: its name ends in _total). `collect` runs under the registry's lock
  // (so it is never removed while it runs) and must not call back into the registry.
  // Returns an id for RemoveCollector.
  int AddCollector(const std::string& name, const std::string& help,
                   const std::vector<std::string>& label_names,
                   std::function<std::vector<CollectedSample>()> collect,
                   Type type = Type::kGauge);
  void RemoveCollector(int id);

  // Every family, by name, each series once: "# HELP", "# TYPE", then its samples.
  std::string Render() const;

 private:
  struct Series {
    LabelValues values;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;
    std::map<LabelValues, Series> series;
  };
  struct Collector {
    Type type;
    std::string name, help;
    std::vector<std::string> label_names;
    std::function<std::vector<CollectedSample>()> collect;
  };
  Series& GetSeries(const std::string& name, Type type, const std::string& help,
                    const std::vector<std::string>& label_names, const LabelValues& values,
                    const std::vector<double>& bounds);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  std::map<int, Collector> collectors_;
  int next_collector_ = 0;
};

// Text format helpers (exposed for tests).
std::string EscapeLabelValue(const std::string& value);  // \ " and newline
std::string EscapeHelp(const std::string& help);          // \ and newline
std::string FormatValue(double value);                    // "+Inf", "NaN", shortest exact
bool IsMetricName(const std::string& name);
bool IsLabelName(const std::string& name);  // also false for "job" and "instance"

}  // namespace pipetrain::metrics
