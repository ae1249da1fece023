#include "metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace pipetrain::metrics {
namespace {

void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

const char* TypeName(Registry::Type type) {
  switch (type) {
    case Registry::Type::kCounter:
      return "counter";
    case Registry::Type::kGauge:
      return "gauge";
    case Registry::Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// {a="x",b="y"} with `extra` (name, value) appended; "" when there are no labels at all.
std::string LabelSet(const std::vector<std::string>& names, const LabelValues& values,
                     const std::pair<std::string, std::string>* extra = nullptr) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += out.empty() ? "{" : ",";
    out += names[i] + "=\"" + EscapeLabelValue(values[i]) + "\"";
  }
  if (extra != nullptr) {
    out += out.empty() ? "{" : ",";
    out += extra->first + "=\"" + extra->second + "\"";
  }
  return out.empty() ? out : out + "}";
}

void CheckFamily(const std::string& name, const std::vector<std::string>& label_names,
                 const LabelValues* values) {
  if (!IsMetricName(name)) throw std::invalid_argument("not a metric name: " + name);
  for (const std::string& l : label_names) {
    if (!IsLabelName(l)) throw std::invalid_argument(name + ": not a label name: " + l);
  }
  if (values != nullptr && values->size() != label_names.size()) {
    throw std::invalid_argument(name + ": label values do not match the label names");
  }
}

}  // namespace

void Counter::Add(double delta) {
  if (delta > 0) AtomicAdd(value_, delta);
}

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      throw std::invalid_argument("histogram bounds must be finite and strictly increasing");
    }
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();  // le
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(total);
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

Registry::Series& Registry::GetSeries(const std::string& name, Type type,
                                      const std::string& help,
                                      const std::vector<std::string>& label_names,
                                      const LabelValues& values,
                                      const std::vector<double>& bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    CheckFamily(name, label_names, &values);
    if (type == Type::kCounter && (name.size() < 6 || name.substr(name.size() - 6) != "_total")) {
      throw std::invalid_argument("a counter's name ends in _total: " + name);
    }
    it = families_.emplace(name, Family{type, help, label_names, bounds, {}}).first;
  } else if (it->second.type != type || it->second.label_names != label_names ||
             it->second.bounds != bounds) {
    throw std::invalid_argument(name + ": made again with another type, labels or buckets");
  } else if (values.size() != label_names.size()) {
    throw std::invalid_argument(name + ": label values do not match the label names");
  }
  Series& series = it->second.series[values];
  if (!series.counter && !series.gauge && !series.histogram) {
    series.values = values;
    switch (type) {
      case Type::kCounter:
        series.counter = std::make_unique<Counter>();
        break;
      case Type::kGauge:
        series.gauge = std::make_unique<Gauge>();
        break;
      case Type::kHistogram:
        series.histogram = std::make_unique<Histogram>(bounds);
        break;
    }
  }
  return series;
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names,
                              const LabelValues& values) {
  return *GetSeries(name, Type::kCounter, help, label_names, values, {}).counter;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help,
                          const std::vector<std::string>& label_names,
                          const LabelValues& values) {
  return *GetSeries(name, Type::kGauge, help, label_names, values, {}).gauge;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names,
                                  const LabelValues& values, const std::vector<double>& bounds) {
  return *GetSeries(name, Type::kHistogram, help, label_names, values, bounds).histogram;
}

void Registry::RemoveSeriesWith(const std::string& label_name, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, family] : families_) {
    const auto at = std::find(family.label_names.begin(), family.label_names.end(), label_name);
    if (at == family.label_names.end()) continue;
    const size_t index = at - family.label_names.begin();
    for (auto it = family.series.begin(); it != family.series.end();) {
      it = it->first[index] == value ? family.series.erase(it) : std::next(it);
    }
  }
}

int Registry::AddCollector(const std::string& name, const std::string& help,
                           const std::vector<std::string>& label_names,
                           std::function<std::vector<CollectedSample>()> collect, Type type) {
  CheckFamily(name, label_names, nullptr);
  if (type == Type::kHistogram) throw std::invalid_argument(name + ": collect gauges or counters");
  if (type == Type::kCounter && (name.size() < 6 || name.substr(name.size() - 6) != "_total")) {
    throw std::invalid_argument("a counter's name ends in _total: " + name);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (families_.count(name)) throw std::invalid_argument(name + ": already a metric");
  for (const auto& [id, c] : collectors_) {
    if (c.name == name) throw std::invalid_argument(name + ": already collected");
  }
  collectors_[next_collector_] = {type, name, help, label_names, std::move(collect)};
  return next_collector_++;
}

void Registry::RemoveCollector(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.erase(id);
}

std::string Registry::Render() const {
  // Name -> its text, so that updated and collected families come out in one name order.
  std::map<std::string, std::string> text;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, family] : families_) {
    if (family.series.empty()) continue;
    std::string& out = text[name];
    out = "# HELP " + name + " " + EscapeHelp(family.help) + "\n# TYPE " + name + " " +
          TypeName(family.type) + "\n";
    for (const auto& [values, series] : family.series) {
      if (series.histogram) {
        const Histogram::Snapshot s = series.histogram->Read();
        const std::vector<double>& bounds = series.histogram->bounds();
        for (size_t b = 0; b <= bounds.size(); ++b) {
          const std::pair<std::string, std::string> le{
              "le", b < bounds.size() ? FormatValue(bounds[b]) : "+Inf"};
          out += name + "_bucket" + LabelSet(family.label_names, values, &le) + " " +
                 std::to_string(s.cumulative[b]) + "\n";
        }
        const std::string labels = LabelSet(family.label_names, values);
        out += name + "_sum" + labels + " " + FormatValue(s.sum) + "\n";
        out += name + "_count" + labels + " " + std::to_string(s.cumulative.back()) + "\n";
      } else {
        const double v = series.counter ? series.counter->value() : series.gauge->value();
        out += name + LabelSet(family.label_names, values) + " " + FormatValue(v) + "\n";
      }
    }
  }
  // Collectors run under the lock (so none is removed while it runs); they never call back.
  for (const auto& [id, c] : collectors_) {
    std::map<LabelValues, double> samples;  // each series once
    for (CollectedSample& s : c.collect()) {
      if (s.labels.size() == c.label_names.size()) samples[std::move(s.labels)] = s.value;
    }
    if (samples.empty()) continue;
    std::string& out = text[c.name];
    out = "# HELP " + c.name + " " + EscapeHelp(c.help) + "\n# TYPE " + c.name + " " +
          TypeName(c.type) + "\n";
    for (const auto& [labels, value] : samples) {
      out += c.name + LabelSet(c.label_names, labels) + " " + FormatValue(value) + "\n";
    }
  }
  std::string all;
  for (const auto& [name, family_text] : text) all += family_text;
  return all;
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

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

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", value);
    return buf;
  }
  char buf[32];
  for (int precision = 6; precision <= 17; ++precision) {  // the shortest exact form
    std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
    if (std::strtod(buf, nullptr) == value) break;
  }
  return buf;
}

bool IsMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool IsLabelName(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0 || name == "job" || name == "instance") {
    return false;
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

}  // namespace pipetrain::metrics
