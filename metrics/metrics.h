// The daemons' Prometheus metrics, kept in prometheus-cpp (core): counters, gauges and
// histograms in a prometheus::Registry, rendered by its TextSerializer (text exposition format
// 0.0.4) and served by metrics/endpoint.h. This class adds what the daemons need on top:
//
//  - one call makes or finds a series by (name, help, label names, label values), checking
//    Prometheus's naming rules and ours (a wrong one is a programming error:
//    std::invalid_argument): names [a-zA-Z_:][a-zA-Z0-9_:]*, label names
//    [a-zA-Z_][a-zA-Z0-9_]* not starting with "__" and never "job" or "instance" (the labels a
//    Prometheus server adds to every series it scrapes), a counter's name ends in _total, one
//    name has one type, help text, label-name list (and buckets);
//  - RemoveSeriesWith drops every series of a finished job or a departed worker;
//  - collectors: families whose samples a callback returns at scrape time (a stage's current
//    action, the jobs in each state), with nothing updated in between.
//
// A series is made once, under this registry's lock; the Counter&, Gauge& or Histogram& it
// returns is then updated from any thread without that lock: counters and gauges are atomics,
// a histogram takes its own short lock (prometheus-cpp's, which keeps its buckets, sum and
// count consistent with a concurrent scrape). A stage's thread never waits for this
// registry's lock. Label values are escaped by prometheus-cpp's serializer, help text here.
//
// Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

namespace pipetrain::metrics {

using Counter = prometheus::Counter;      // Increment(delta >= 0); a negative delta is ignored
using Gauge = prometheus::Gauge;          // Set, Increment, Decrement
using Histogram = prometheus::Histogram;  // Observe

// Label values, in the order of the family's label names.
using LabelValues = std::vector<std::string>;

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

  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The series of `name` with these label values, made on first use. Every call for one
  // name must give the same help, label names (and for histograms, bounds: finite and
  // strictly increasing; +Inf is implied).
  Counter& GetCounter(const std::string& name, const std::string& help,
                      const std::vector<std::string>& label_names, const LabelValues& values);
  Gauge& GetGauge(const std::string& name, const std::string& help,
                  const std::vector<std::string>& label_names, const LabelValues& values);
  Histogram& GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names, const LabelValues& values,
                          const std::vector<double>& bounds);

  // Removes every series (of every family) whose label `label_name` is `value`: a finished
  // job's or a departed worker's. References to them must no longer be used.
  void RemoveSeriesWith(const std::string& label_name, const std::string& value);

  // A family whose samples `collect` returns at each scrape (a gauge, or a counter whose
  // source only grows: its name ends in _total). `collect` runs under the registry's lock
  // (so it is never removed while it runs) and must not call back into the registry.
  // Returns an id for RemoveCollector.
  int AddCollector(const std::string& name, const std::string& help,
                   const std::vector<std::string>& label_names,
                   std::function<std::vector<CollectedSample>()> collect, Type type = Type::kGauge);
  void RemoveCollector(int id);

  // What a scrape sees: every family with at least one series, by name, each series once.
  std::vector<prometheus::MetricFamily> Collect() const;
  // Collect() in the text exposition format (what GET /metrics answers, uncompressed).
  std::string Render() const;
  // The collectable an endpoint serves; it answers Collect() of this registry while the
  // registry lives and nothing after (an endpoint holds it by weak_ptr).
  std::shared_ptr<prometheus::Collectable> collectable() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// Prometheus's name rules (exposed for tests).
bool IsMetricName(const std::string& name);
bool IsLabelName(const std::string& name);  // also false for "job" and "instance"

}  // namespace pipetrain::metrics
