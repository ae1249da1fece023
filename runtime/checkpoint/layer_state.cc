#include "runtime/checkpoint/layer_state.h"

#include <map>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pipetrain::checkpoint {
namespace {

std::string Describe(const at::Tensor& t) {
  return absl::StrCat(std::string(c10::toString(t.scalar_type())), c10::str(t.sizes()));
}

bool SameKind(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes();
}

}  // namespace

std::string SerializeLayerState(const LayerState& state) {
  c10::Dict<std::string, at::Tensor> dict;
  for (size_t k = 0; k < state.parameters.size(); ++k) {
    dict.insert(absl::StrCat("param.", k), state.parameters[k].detach().cpu().contiguous());
  }
  for (size_t k = 0; k < state.buffers.size(); ++k) {
    dict.insert(absl::StrCat("buffer.", k), state.buffers[k].detach().cpu().contiguous());
  }
  for (size_t k = 0; k < state.optimizer.size(); ++k) {
    for (const auto& [name, tensor] : state.optimizer[k]) {
      dict.insert(absl::StrCat("optim.", k, ".", name), tensor.detach().cpu().contiguous());
    }
  }
  for (size_t k = 0; k < state.stale_parameters.size(); ++k) {
    dict.insert(absl::StrCat("stale_param.", k),
                state.stale_parameters[k].detach().cpu().contiguous());
  }
  for (size_t k = 0; k < state.stale_buffers.size(); ++k) {
    dict.insert(absl::StrCat("stale_buffer.", k),
                state.stale_buffers[k].detach().cpu().contiguous());
  }
  const std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  return std::string(bytes.begin(), bytes.end());
}

absl::StatusOr<LayerState> ParseLayerState(const std::string& bytes) {
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::DataLossError(absl::StrCat("not a layer file: ", what.substr(0, what.find('\n'))));
  }
  if (!value.isGenericDict()) return absl::DataLossError("a layer file holds a dict");
  std::map<int64_t, at::Tensor> params, buffers, stale_params, stale_buffers;
  std::map<int64_t, weights::ParameterState> optimizer;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor()) {
      return absl::DataLossError("a layer file maps names to tensors");
    }
    const std::string key = entry.key().toStringRef();
    const std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('.', 2));
    int64_t k = -1;
    if (parts.size() < 2 || !absl::SimpleAtoi(parts[1], &k) || k < 0 || k > (1 << 20)) {
      return absl::DataLossError(absl::StrCat("layer file: unknown entry '", key, "'"));
    }
    const at::Tensor t = entry.value().toTensor();
    if (parts[0] == "param" && parts.size() == 2) {
      params[k] = t;
    } else if (parts[0] == "buffer" && parts.size() == 2) {
      buffers[k] = t;
    } else if (parts[0] == "stale_param" && parts.size() == 2) {
      stale_params[k] = t;
    } else if (parts[0] == "stale_buffer" && parts.size() == 2) {
      stale_buffers[k] = t;
    } else if (parts[0] == "optim" && parts.size() == 3 && !parts[2].empty()) {
      optimizer[k][parts[2]] = t;
    } else {
      return absl::DataLossError(absl::StrCat("layer file: unknown entry '", key, "'"));
    }
  }
  LayerState state;
  // Numbered 0 .. K-1 without gaps, into `out`.
  const auto in_order = [](const std::map<int64_t, at::Tensor>& numbered, const char* name,
                           std::vector<at::Tensor>& out) -> absl::Status {
    for (const auto& [k, t] : numbered) {
      if (k != static_cast<int64_t>(out.size())) {
        return absl::DataLossError(absl::StrCat("layer file: no ", name, ".", out.size()));
      }
      out.push_back(t);
    }
    return absl::OkStatus();
  };
  if (absl::Status s = in_order(params, "param", state.parameters); !s.ok()) return s;
  if (absl::Status s = in_order(buffers, "buffer", state.buffers); !s.ok()) return s;
  if (absl::Status s = in_order(stale_params, "stale_param", state.stale_parameters); !s.ok()) {
    return s;
  }
  if (absl::Status s = in_order(stale_buffers, "stale_buffer", state.stale_buffers); !s.ok()) {
    return s;
  }
  state.optimizer.resize(state.parameters.size());
  for (auto& [k, s] : optimizer) {
    if (k >= static_cast<int64_t>(state.parameters.size())) {
      return absl::DataLossError(absl::StrCat("layer file: optimizer state of parameter ", k,
                                              ", which the layer does not have"));
    }
    state.optimizer[k] = std::move(s);
  }
  return state;
}

std::vector<LayerState> StageLayerStates(const weights::WeightStore& weights) {
  const model::StageModule& module = weights.Newest();
  const std::vector<weights::ParameterState> optimizer = weights.OptimizerState();
  std::vector<LayerState> out;
  size_t position = 0;  // in module.OwnParameters(): a shared parameter has no state here
  int index = 0;        // in module.Parameters()
  for (const auto& layer : module.layers()) {
    LayerState state;
    for (const at::Tensor& p : layer->Parameters()) {
      state.parameters.push_back(p.detach().clone());
      const bool own = !module.IsShared(index++);
      state.optimizer.push_back(own && position < optimizer.size() ? optimizer[position]
                                                                   : weights::ParameterState{});
      if (own) ++position;
    }
    for (const at::Tensor& b : layer->Buffers()) state.buffers.push_back(b.detach().clone());
    out.push_back(std::move(state));
  }
  if (const model::StageModule* stale = weights.StaleForNext(); stale != nullptr) {
    for (size_t l = 0; l < stale->layers().size(); ++l) {
      const auto& layer = stale->layers()[l];
      for (const at::Tensor& p : layer->Parameters()) {
        out[l].stale_parameters.push_back(p.detach().clone());
      }
      for (const at::Tensor& b : layer->Buffers()) {
        out[l].stale_buffers.push_back(b.detach().clone());
      }
    }
  }
  return out;
}

bool HaveStaleVersion(const std::vector<LayerState>& states) {
  bool some = false;
  for (const LayerState& s : states) {
    if (s.stale_parameters.size() != s.parameters.size() ||
        s.stale_buffers.size() != s.buffers.size()) {
      return false;
    }
    some = some || !s.stale_parameters.empty() || !s.stale_buffers.empty();
  }
  return some;
}

absl::Status LoadStaleLayerStates(const std::vector<LayerState>& states,
                                  model::StageModule* module) {
  std::vector<LayerState> stale(states.size());
  for (size_t l = 0; l < states.size(); ++l) {
    stale[l].parameters = states[l].stale_parameters;
    stale[l].buffers = states[l].stale_buffers;
    stale[l].optimizer.resize(stale[l].parameters.size());
  }
  return LoadLayerStates(stale, module).status();
}

absl::StatusOr<std::vector<weights::ParameterState>> LoadLayerStates(
    const std::vector<LayerState>& states, model::StageModule* module) {
  const auto& layers = module->layers();
  if (states.size() != layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the stage has ", layers.size(),
                                                   " layers; the checkpoint gave ", states.size()));
  }
  // Check everything before changing anything.
  for (size_t l = 0; l < layers.size(); ++l) {
    const int global = module->first_layer() + static_cast<int>(l);
    const std::vector<at::Tensor> params = layers[l]->Parameters(), buffers = layers[l]->Buffers();
    const LayerState& s = states[l];
    if (s.parameters.size() != params.size() || s.buffers.size() != buffers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", global, " (", layers[l]->name(), ") has ", params.size(),
                       " parameters and ", buffers.size(), " buffers; the checkpoint's has ",
                       s.parameters.size(), " and ", s.buffers.size()));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (!SameKind(params[k], s.parameters[k])) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", global, " parameter ", k, ": the model's is ",
                         Describe(params[k]), ", the checkpoint's ", Describe(s.parameters[k])));
      }
      for (const auto& [name, t] : s.optimizer[k]) {
        if (name != "step" && !SameKind(params[k], t)) {
          return absl::InvalidArgumentError(
              absl::StrCat("layer ", global, " parameter ", k, ": optimizer state ", name, " is ",
                           Describe(t), ", not ", Describe(params[k])));
        }
      }
    }
    for (size_t k = 0; k < buffers.size(); ++k) {
      if (!SameKind(buffers[k], s.buffers[k])) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", global, " buffer ", k, ": the model's is ", Describe(buffers[k]),
                         ", the checkpoint's ", Describe(s.buffers[k])));
      }
    }
  }
  std::vector<weights::ParameterState> optimizer;
  at::NoGradGuard no_grad;
  int index = 0;  // in module->Parameters()
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::vector<at::Tensor> params = layers[l]->Parameters(), buffers = layers[l]->Buffers();
    for (size_t k = 0; k < params.size(); ++k) {
      params[k].copy_(states[l].parameters[k]);
      if (!module->IsShared(index++)) optimizer.push_back(states[l].optimizer[k]);
    }
    for (size_t k = 0; k < buffers.size(); ++k) buffers[k].copy_(states[l].buffers[k]);
  }
  return optimizer;
}

}  // namespace pipetrain::checkpoint
