#include "metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include <prometheus/check_names.h>
#include <prometheus/text_serializer.h>

namespace pipetrain::metrics {
namespace {

bool EndsWithTotal(const std::string& name) {
  return name.size() >= 6 && name.compare(name.size() - 6, 6, "_total") == 0;
}

void CheckFamily(const std::string& name, const std::vector<std::string>& label_names) {
  if (!IsMetricName(name)) throw std::invalid_argument("not a metric name: " + name);
  for (const std::string& l : label_names) {
    if (!IsLabelName(l)) throw std::invalid_argument(name + ": not a label name: " + l);
  }
}

void CheckBounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      throw std::invalid_argument("histogram bounds must be finite and strictly increasing");
    }
  }
}

prometheus::Labels LabelsOf(const std::vector<std::string>& names, const LabelValues& values) {
  prometheus::Labels labels;
  for (size_t i = 0; i < names.size(); ++i) labels.emplace(names[i], values[i]);
  return labels;
}

prometheus::MetricType TypeOf(Registry::Type type) {
  switch (type) {
    case Registry::Type::kCounter: return prometheus::MetricType::Counter;
    case Registry::Type::kGauge: return prometheus::MetricType::Gauge;
    case Registry::Type::kHistogram: return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

// HELP text as the exposition format wants it (backslash and newline escaped), which
// prometheus-cpp 1.0.1's serializer writes as given.
std::string EscapeHelp(const std::string& help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// The registry's families and collectors, and the Collectable an endpoint scrapes.
struct Registry::State : prometheus::Collectable {
  struct Family {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;
    // Exactly one is set, by type; owned by `registry`.
    prometheus::Family<Counter>* counters = nullptr;
    prometheus::Family<Gauge>* gauges = nullptr;
    prometheus::Family<Histogram>* histograms = nullptr;
    std::map<LabelValues, void*> series;  // the metric each label set made
  };
  struct Collector {
    Type type;
    std::string name, help;
    std::vector<std::string> label_names;
    std::function<std::vector<CollectedSample>()> collect;
  };

  std::vector<prometheus::MetricFamily> Collect() const override;

  // The family of `name`, made on first use; throws where a rule is broken.
  Family& FamilyOf(const std::string& name, Type type, const std::string& help,
                   const std::vector<std::string>& label_names, const LabelValues& values,
                   const std::vector<double>& bounds);

  mutable std::mutex mu;
  prometheus::Registry registry;
  std::map<std::string, Family> families;
  std::map<int, Collector> collectors;
  int next_collector = 0;
};

Registry::State::Family& Registry::State::FamilyOf(const std::string& name, Type type,
                                                   const std::string& help,
                                                   const std::vector<std::string>& label_names,
                                                   const LabelValues& values,
                                                   const std::vector<double>& bounds) {
  auto it = families.find(name);
  if (it == families.end()) {
    CheckFamily(name, label_names);
    if (type == Type::kCounter && !EndsWithTotal(name)) {
      throw std::invalid_argument("a counter's name ends in _total: " + name);
    }
    if (type == Type::kHistogram) CheckBounds(bounds);
    for (const auto& [id, c] : collectors) {
      if (c.name == name) throw std::invalid_argument(name + ": already collected");
    }
    if (values.size() != label_names.size()) {
      throw std::invalid_argument(name + ": label values do not match the label names");
    }
    Family family;
    family.type = type;
    family.help = help;
    family.label_names = label_names;
    family.bounds = bounds;
    switch (type) {
      case Type::kCounter:
        family.counters = &prometheus::BuildCounter().Name(name).Help(help).Register(registry);
        break;
      case Type::kGauge:
        family.gauges = &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
        break;
      case Type::kHistogram:
        family.histograms = &prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
        break;
    }
    it = families.emplace(name, std::move(family)).first;
  } else if (it->second.type != type || it->second.label_names != label_names ||
             it->second.bounds != bounds) {
    throw std::invalid_argument(name + ": made again with another type, labels or buckets");
  } else if (values.size() != label_names.size()) {
    throw std::invalid_argument(name + ": label values do not match the label names");
  }
  return it->second;
}

std::vector<prometheus::MetricFamily> Registry::State::Collect() const {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<prometheus::MetricFamily> out;
  for (prometheus::MetricFamily& family : registry.Collect()) {
    if (!family.metric.empty()) out.push_back(std::move(family));
  }
  // Collectors run under the lock (so none is removed while it runs); they never call back.
  for (const auto& [id, c] : collectors) {
    std::map<LabelValues, double> samples;  // each series once
    for (CollectedSample& s : c.collect()) {
      if (s.labels.size() == c.label_names.size()) samples[std::move(s.labels)] = s.value;
    }
    if (samples.empty()) continue;
    prometheus::MetricFamily family{c.name, c.help, TypeOf(c.type), {}};
    for (const auto& [values, value] : samples) {
      prometheus::ClientMetric metric;
      for (const auto& [label, label_value] : LabelsOf(c.label_names, values)) {
        metric.label.push_back({label, label_value});
      }
      if (c.type == Type::kCounter) {
        metric.counter.value = value;
      } else {
        metric.gauge.value = value;
      }
      family.metric.push_back(std::move(metric));
    }
    out.push_back(std::move(family));
  }
  std::sort(out.begin(), out.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) {
              return a.name < b.name;
            });
  for (prometheus::MetricFamily& family : out) family.help = EscapeHelp(family.help);
  return out;
}

Registry::Registry() : state_(std::make_shared<State>()) {}

Registry::~Registry() {
  // An endpoint may still hold the state for a scrape in flight: it must find no collector
  // whose callback reads what is going away.
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->collectors.clear();
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names,
                              const LabelValues& values) {
  std::lock_guard<std::mutex> lock(state_->mu);
  State::Family& f = state_->FamilyOf(name, Type::kCounter, help, label_names, values, {});
  Counter& c = f.counters->Add(LabelsOf(label_names, values));
  f.series[values] = &c;
  return c;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names, const LabelValues& values) {
  std::lock_guard<std::mutex> lock(state_->mu);
  State::Family& f = state_->FamilyOf(name, Type::kGauge, help, label_names, values, {});
  Gauge& g = f.gauges->Add(LabelsOf(label_names, values));
  f.series[values] = &g;
  return g;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names,
                                  const LabelValues& values, const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> lock(state_->mu);
  State::Family& f = state_->FamilyOf(name, Type::kHistogram, help, label_names, values, bounds);
  Histogram& h = f.histograms->Add(LabelsOf(label_names, values), bounds);
  f.series[values] = &h;
  return h;
}

void Registry::RemoveSeriesWith(const std::string& label_name, const std::string& value) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& [name, family] : state_->families) {
    const auto at = std::find(family.label_names.begin(), family.label_names.end(), label_name);
    if (at == family.label_names.end()) continue;
    const size_t index = at - family.label_names.begin();
    for (auto it = family.series.begin(); it != family.series.end();) {
      if (it->first[index] != value) {
        ++it;
        continue;
      }
      if (family.counters != nullptr) family.counters->Remove(static_cast<Counter*>(it->second));
      if (family.gauges != nullptr) family.gauges->Remove(static_cast<Gauge*>(it->second));
      if (family.histograms != nullptr) {
        family.histograms->Remove(static_cast<Histogram*>(it->second));
      }
      it = family.series.erase(it);
    }
  }
}

int Registry::AddCollector(const std::string& name, const std::string& help,
                           const std::vector<std::string>& label_names,
                           std::function<std::vector<CollectedSample>()> collect, Type type) {
  CheckFamily(name, label_names);
  if (type == Type::kHistogram) throw std::invalid_argument(name + ": collect gauges or counters");
  if (type == Type::kCounter && !EndsWithTotal(name)) {
    throw std::invalid_argument("a counter's name ends in _total: " + name);
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->families.count(name)) throw std::invalid_argument(name + ": already a metric");
  for (const auto& [id, c] : state_->collectors) {
    if (c.name == name) throw std::invalid_argument(name + ": already collected");
  }
  state_->collectors[state_->next_collector] = {type, name, help, label_names, std::move(collect)};
  return state_->next_collector++;
}

void Registry::RemoveCollector(int id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->collectors.erase(id);
}

std::vector<prometheus::MetricFamily> Registry::Collect() const { return state_->Collect(); }

std::string Registry::Render() const {
  return prometheus::TextSerializer().Serialize(state_->Collect());
}

std::shared_ptr<prometheus::Collectable> Registry::collectable() const { return state_; }

std::vector<double> SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

bool IsMetricName(const std::string& name) { return prometheus::CheckMetricName(name); }

bool IsLabelName(const std::string& name) {
  return name != "job" && name != "instance" && prometheus::CheckLabelName(name);
}

}  // namespace pipetrain::metrics
