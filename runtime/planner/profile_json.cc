#include "runtime/planner/profile_json.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace pipetrain::planner {
namespace {

using nlohmann::json;

json LinkJson(const LinkProfile& link) {
  return {{"latency_s", link.latency_s}, {"bytes_per_s", link.bytes_per_s}};
}

json SizeJson(const MicroBatchProfile& size) {
  json layers = json::array();
  for (const LayerProfile& l : size.layers) {
    json layer = {{"name", l.name},
                  {"forward_s", l.forward_s},
                  {"backward_s", l.backward_s},
                  {"optimizer_s", l.optimizer_s},
                  {"output_bytes", l.output_bytes},
                  {"parameter_bytes", l.parameter_bytes},
                  {"optimizer_bytes", l.optimizer_bytes},
                  {"stash_bytes", l.stash_bytes},
                  {"working_bytes", l.working_bytes}};
    if (l.weight_gradient_s >= 0) layer["weight_gradient_s"] = l.weight_gradient_s;
    layers.push_back(std::move(layer));
  }
  return {{"micro_batch_size", size.micro_batch_size}, {"layers", layers}};
}

// Reads field `key` of object `j` into `out`; the error names `where`.key.
template <typename T>
absl::Status Read(const json& j, const char* key, const std::string& where, T& out) {
  auto it = j.find(key);
  if (it == j.end()) return absl::InvalidArgumentError(absl::StrCat(where, key, ": missing"));
  try {
    out = it->template get<T>();
  } catch (const json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, ": wrong type"));
  }
  if constexpr (std::is_arithmetic_v<T>) {
    if (!(out >= 0) || !std::isfinite(static_cast<double>(out))) {
      return absl::InvalidArgumentError(absl::StrCat(where, key, ": must be finite and >= 0"));
    }
  }
  return absl::OkStatus();
}

#define PT_READ(j, key, where, out) \
  if (absl::Status s = Read(j, key, where, out); !s.ok()) return s

absl::StatusOr<LinkProfile> ReadLink(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": missing or not an object"));
  }
  LinkProfile link;
  const std::string where = absl::StrCat(key, ".");
  PT_READ(*it, "latency_s", where, link.latency_s);
  PT_READ(*it, "bytes_per_s", where, link.bytes_per_s);
  if (!(link.bytes_per_s > 0))
    return absl::InvalidArgumentError(absl::StrCat(where, "bytes_per_s: must be > 0"));
  return link;
}

json HostLinksJson(const HostLinks& links) {
  return {{"p2p", LinkJson(links.p2p)}, {"allreduce", LinkJson(links.allreduce)}};
}

absl::StatusOr<HostLinks> ReadHostLinks(const json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("not an object");
  HostLinks links;
  absl::StatusOr<LinkProfile> p2p = ReadLink(j, "p2p");
  if (!p2p.ok()) return p2p.status();
  absl::StatusOr<LinkProfile> allreduce = ReadLink(j, "allreduce");
  if (!allreduce.ok()) return allreduce.status();
  links.p2p = *p2p;
  links.allreduce = *allreduce;
  return links;
}

absl::StatusOr<MicroBatchProfile> ReadSize(const json& j, const std::string& where) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  MicroBatchProfile size;
  PT_READ(j, "micro_batch_size", where + ".", size.micro_batch_size);
  if (size.micro_batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".micro_batch_size: must be >= 1"));
  }
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array() || layers->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".layers: missing or empty"));
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    const json& l = (*layers)[i];
    const std::string at = absl::StrCat(where, ".layers[", i, "].");
    if (!l.is_object()) return absl::InvalidArgumentError(absl::StrCat(at, ": not an object"));
    LayerProfile layer;
    PT_READ(l, "name", at, layer.name);
    PT_READ(l, "forward_s", at, layer.forward_s);
    PT_READ(l, "backward_s", at, layer.backward_s);
    PT_READ(l, "optimizer_s", at, layer.optimizer_s);
    PT_READ(l, "output_bytes", at, layer.output_bytes);
    PT_READ(l, "parameter_bytes", at, layer.parameter_bytes);
    PT_READ(l, "optimizer_bytes", at, layer.optimizer_bytes);
    PT_READ(l, "stash_bytes", at, layer.stash_bytes);
    PT_READ(l, "working_bytes", at, layer.working_bytes);
    if (l.contains("weight_gradient_s")) {  // measured by newer builds
      PT_READ(l, "weight_gradient_s", at, layer.weight_gradient_s);
    }
    size.layers.push_back(std::move(layer));
  }
  return size;
}

json MachineJson(const ModelProfile& p) {
  json messages = json::array();
  for (const MessageCost& c : p.message_costs) {
    messages.push_back({{"bytes", c.bytes},
                        {"send_s", c.send_s},
                        {"recv_s", c.recv_s},
                        {"background_s", c.background_s},
                        {"latency_s", c.latency_s}});
  }
  json j = {{"slowdown", p.slowdown},
            {"p2p", LinkJson(p.p2p)},
            {"allreduce", LinkJson(p.allreduce)},
            {"message_costs", messages}};
  if (p.allreduce_cpu.bytes_per_s > 0) j["allreduce_cpu"] = LinkJson(p.allreduce_cpu);
  return j;
}

// The links and cores (slowdown, p2p, allreduce, allreduce_cpu, message_costs) into `p`.
absl::Status ReadMachine(const json& j, ModelProfile& p) {
  p.slowdown.clear();
  if (auto it = j.find("slowdown"); it != j.end()) {
    if (!it->is_array() || it->size() > 4096) {
      return absl::InvalidArgumentError("slowdown: expected an array of at most 4096 factors");
    }
    for (const json& f : *it) {
      if (!f.is_number() || !(f.get<double>() >= 1.0) || !std::isfinite(f.get<double>())) {
        return absl::InvalidArgumentError("slowdown: every factor must be finite and >= 1");
      }
      p.slowdown.push_back(f.get<double>());
    }
  }
  absl::StatusOr<LinkProfile> p2p = ReadLink(j, "p2p");
  if (!p2p.ok()) return p2p.status();
  p.p2p = *p2p;
  absl::StatusOr<LinkProfile> allreduce = ReadLink(j, "allreduce");
  if (!allreduce.ok()) return allreduce.status();
  p.allreduce = *allreduce;
  p.allreduce_cpu = LinkProfile{0, 0};
  if (j.contains("allreduce_cpu")) {
    absl::StatusOr<LinkProfile> cpu = ReadLink(j, "allreduce_cpu");
    if (!cpu.ok()) return cpu.status();
    p.allreduce_cpu = *cpu;
  }
  p.message_costs.clear();
  if (auto it = j.find("message_costs"); it != j.end()) {
    if (!it->is_array() || it->size() > 64) {
      return absl::InvalidArgumentError("message_costs: expected an array of at most 64 sizes");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const json& c = (*it)[i];
      const std::string at = absl::StrCat("message_costs[", i, "].");
      if (!c.is_object()) return absl::InvalidArgumentError(absl::StrCat(at, ": not an object"));
      MessageCost cost;
      PT_READ(c, "bytes", at, cost.bytes);
      PT_READ(c, "send_s", at, cost.send_s);
      PT_READ(c, "recv_s", at, cost.recv_s);
      PT_READ(c, "background_s", at, cost.background_s);
      if (c.contains("latency_s")) PT_READ(c, "latency_s", at, cost.latency_s);
      if (!p.message_costs.empty() && cost.bytes <= p.message_costs.back().bytes) {
        return absl::InvalidArgumentError(absl::StrCat(at, "bytes: sizes must ascend"));
      }
      p.message_costs.push_back(cost);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string MachineProfileToJson(const ModelProfile& profile) {
  return MachineJson(profile).dump();
}

absl::Status MachineProfileFromJson(const std::string& text, ModelProfile* profile) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  return ReadMachine(j, *profile);
}

std::string MicroBatchProfileToJson(const MicroBatchProfile& size) { return SizeJson(size).dump(); }

std::string ModelProfileToJson(const ModelProfile& p) {
  json sizes = json::array();
  for (const MicroBatchProfile& size : p.sizes) sizes.push_back(SizeJson(size));
  json j = MachineJson(p);
  j.update(json{{"model", p.model},
                {"device", p.device},
                {"dtype", p.dtype},
                {"threads", p.threads},
                {"tokens_per_sample", p.tokens_per_sample},
                {"base_bytes", p.base_bytes},
                {"receive_buffer_bytes", p.receive_buffer_bytes},
                {"inline_buffer_bytes", p.inline_buffer_bytes},
                {"sizes", sizes}});
  if (p.between_hosts.measured()) j["between_hosts"] = HostLinksJson(p.between_hosts);
  return j.dump();
}

std::string HostLinksToJson(const HostLinks& links) { return HostLinksJson(links).dump(); }

absl::StatusOr<HostLinks> HostLinksFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  return ReadHostLinks(j);
}

absl::StatusOr<MicroBatchProfile> MicroBatchProfileFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("not JSON");
  return ReadSize(j, "size");
}

absl::StatusOr<ModelProfile> ModelProfileFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  ModelProfile p;
  PT_READ(j, "model", "", p.model);
  PT_READ(j, "device", "", p.device);
  PT_READ(j, "dtype", "", p.dtype);
  PT_READ(j, "threads", "", p.threads);
  PT_READ(j, "tokens_per_sample", "", p.tokens_per_sample);
  PT_READ(j, "base_bytes", "", p.base_bytes);
  PT_READ(j, "receive_buffer_bytes", "", p.receive_buffer_bytes);
  PT_READ(j, "inline_buffer_bytes", "", p.inline_buffer_bytes);
  if (absl::Status m = ReadMachine(j, p); !m.ok()) return m;
  if (auto it = j.find("between_hosts"); it != j.end()) {
    absl::StatusOr<HostLinks> links = ReadHostLinks(*it);
    if (!links.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("between_hosts.", links.status().message()));
    }
    p.between_hosts = *links;
  }
  auto sizes = j.find("sizes");
  if (sizes == j.end() || !sizes->is_array() || sizes->empty()) {
    return absl::InvalidArgumentError("sizes: missing or empty");
  }
  for (size_t i = 0; i < sizes->size(); ++i) {
    absl::StatusOr<MicroBatchProfile> size = ReadSize((*sizes)[i], absl::StrCat("sizes[", i, "]"));
    if (!size.ok()) return size.status();
    if (!p.sizes.empty() && size->layers.size() != p.sizes.front().layers.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sizes[", i, "]: ", size->layers.size(),
                                                     " layers, sizes[0] has ",
                                                     p.sizes.front().layers.size()));
    }
    p.sizes.push_back(*std::move(size));
  }
  return p;
}

}  // namespace pipetrain::planner
