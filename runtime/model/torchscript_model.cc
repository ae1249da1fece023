// Models brought from Python as TorchScript: each child of the saved module is a Layer, its
// randomness replayed from the LayerContext. See torchscript_model.h.
#include "runtime/model/torchscript_model.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/regular_file.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/weight_gradients.h"

namespace pipetrain::model {
namespace {

// One child of a TorchScript nn.Sequential. Randomness inside TorchScript draws from the
// process-wide generator; for children whose graph has random ops, the generator is
// re-seeded from the LayerContext under a process-wide lock, so recomputation replays it.
std::mutex& ScriptRngMutex() {
  static std::mutex mu;
  return mu;
}

bool GraphUsesRandomness(const torch::jit::Block* block) {
  for (const torch::jit::Node* node : block->nodes()) {
    const std::string kind = node->kind().toQualString();
    for (const char* word : {"dropout", "rand", "bernoulli", "normal", "multinomial"}) {
      if (kind.find(word) != std::string::npos) return true;
    }
    for (const torch::jit::Block* sub : node->blocks()) {
      if (GraphUsesRandomness(sub)) return true;
    }
  }
  return false;
}

class ScriptLayer : public Layer {
 public:
  ScriptLayer(std::string name, torch::jit::Module module)
      : name_(std::move(name)), module_(std::move(module)) {
    auto graph = module_.get_method("forward").graph()->copy();
    torch::jit::Inline(*graph);
    uses_randomness_ = GraphUsesRandomness(graph->block());
  }
  std::string name() const override { return name_; }
  // The names of Parameters(), in order ("weight", "sub.bias").
  std::vector<std::string> ParameterNames() const {
    std::vector<std::string> out;
    for (const auto& p : module_.named_parameters()) out.push_back(p.name);
    return out;
  }
  // The module whole on the generic path of weight_gradients.h: under a split backward, the
  // nodes of its graph that lead both to its input and to a parameter run in I and again in W.
  at::Tensor Forward(const at::Tensor& input, const LayerContext& ctx) override {
    return SplitBackward(input, Parameters(), ctx.weight_gradients,
                         [&](const at::Tensor& in) { return Run(in, ctx); });
  }
  std::vector<at::Tensor> Parameters() const override {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : module_.parameters()) out.push_back(p);
    return out;
  }
  // As PyTorch code groups parameters for weight decay: a parameter named "bias" is a bias; one
  // of a module whose class's name contains "Norm" (LayerNorm, BatchNorm2d, GroupNorm,
  // RMSNorm) a norm, of one whose class's name contains "Embedding" an embedding.
  std::vector<ParameterKinds> ParameterKindsOf() const override {
    std::map<std::string, std::string> class_of;  // module path ("" the layer) -> class name
    for (const auto& m : module_.named_modules()) {
      std::string name = m.value.type()->name() ? m.value.type()->name()->name() : "";
      class_of[m.name] = std::move(name);
    }
    std::vector<ParameterKinds> kinds;
    for (const std::string& path : ParameterNames()) {
      const size_t dot = path.rfind('.');
      const std::string owner = dot == std::string::npos ? "" : path.substr(0, dot);
      const std::string leaf = dot == std::string::npos ? path : path.substr(dot + 1);
      const std::string& cls = class_of[owner];
      ParameterKinds k = 0;
      if (leaf == "bias") k |= KindBit(ParameterKind::kBias);
      if (absl::StrContains(cls, "Norm")) k |= KindBit(ParameterKind::kNorm);
      if (absl::StrContains(cls, "Embedding")) k |= KindBit(ParameterKind::kEmbedding);
      kinds.push_back(k);
    }
    return kinds;
  }
  std::vector<at::Tensor> Buffers() const override {
    std::vector<at::Tensor> out;
    for (const at::Tensor& b : module_.buffers()) out.push_back(b);
    return out;
  }
  std::unique_ptr<Layer> Clone() const override {
    // Without grad mode the copies are fresh leaves rather than outputs of a clone op.
    at::NoGradGuard no_grad;
    torch::jit::Module copy = module_.deepcopy();
    for (at::Tensor p : copy.parameters()) p.requires_grad_(true);
    return std::make_unique<ScriptLayer>(name_, std::move(copy));
  }
  void ToDtype(at::ScalarType dtype) override { module_.to(dtype); }
  void ToDevice(at::Device device) override { module_.to(device); }
  void SetTraining(bool training) override { module_.train(training); }

 private:
  // The module's forward, its dropout drawn from the context's seed.
  at::Tensor Run(const at::Tensor& input, const LayerContext& ctx) {
    if (!uses_randomness_ || !module_.is_training()) {
      return module_.forward({input}).toTensor();
    }
    std::lock_guard<std::mutex> lock(ScriptRngMutex());
    auto gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> gen_lock(gen.mutex());
      gen.set_current_seed(RandomSeedFor(ctx));
    }
    return module_.forward({input}).toTensor();
  }

  std::string name_;
  mutable torch::jit::Module module_;
  bool uses_randomness_ = false;
};

}  // namespace

absl::StatusOr<LayerList> LoadTorchScript(const std::string& path) {
  torch::jit::Module root;
  // Read once through the bounded reader (never blocking on a FIFO), then loaded from memory.
  absl::StatusOr<std::string> bytes =
      ReadRegularFile(path, kMaxModelFileBytes, "TorchScript model");
  if (!bytes.ok()) return absl::InvalidArgumentError(bytes.status().message());
  try {
    std::istringstream in(*std::move(bytes));
    root = torch::jit::load(in);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load TorchScript model '", path, "': ", what));
  }
  LayerList layers;
  for (const auto& child : root.named_children()) {
    if (!child.value.find_method("forward")) {
      return absl::InvalidArgumentError(absl::StrCat("TorchScript model '", path, "': child '",
                                                     child.name, "' has no forward method"));
    }
    layers.push_back(std::make_unique<ScriptLayer>(child.name, child.value));
  }
  // Trainable whatever the file says (a module saved with frozen parameters too).
  for (at::Tensor p : root.parameters()) p.requires_grad_(true);
  if (layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TorchScript model '", path,
        "' has no child modules: save an nn.Sequential whose children are the layers"));
  }
  return layers;
}

absl::StatusOr<std::vector<TieGroup>> ScriptTieGroups(const LayerList& layers,
                                                      const std::vector<std::string>& tie) {
  std::vector<std::string> errors;
  std::vector<TieGroup> groups;
  std::vector<std::string> seen;  // every member named so far
  for (const std::string& text : tie) {
    const std::vector<std::string> names = absl::StrSplit(text, '=');
    if (names.size() < 2) {
      errors.push_back(absl::StrCat("model.tie '", text,
                                    "': a group ties two or more "
                                    "parameters (A=B)"));
      continue;
    }
    TieGroup group;
    std::vector<at::Tensor> values;
    for (const std::string& name : names) {
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
        errors.push_back(absl::StrCat("model.tie: ", name, " is tied twice"));
        continue;
      }
      seen.push_back(name);
      const size_t dot = name.find('.');
      const std::string child = name.substr(0, dot);
      const std::string parameter = dot == std::string::npos ? "" : name.substr(dot + 1);
      int layer = -1;
      for (size_t l = 0; l < layers.size(); ++l) {
        if (layers[l]->name() == child) layer = static_cast<int>(l);
      }
      const auto* script =
          layer < 0 ? nullptr : dynamic_cast<const ScriptLayer*>(layers[layer].get());
      if (script == nullptr) {
        std::vector<std::string> children;
        for (const auto& l : layers) children.push_back(l->name());
        errors.push_back(absl::StrCat("model.tie: no layer '", child, "' for ", name,
                                      " (the layers: ", absl::StrJoin(children, ", "), ")"));
        continue;
      }
      const std::vector<std::string> parameters = script->ParameterNames();
      const auto at = std::find(parameters.begin(), parameters.end(), parameter);
      if (at == parameters.end()) {
        errors.push_back(absl::StrCat("model.tie: layer ", child, " has no parameter '", parameter,
                                      "' (its parameters: ", absl::StrJoin(parameters, ", "), ")"));
        continue;
      }
      const int index = static_cast<int>(at - parameters.begin());
      group.push_back({layer, index});
      values.push_back(script->Parameters()[index]);
    }
    for (size_t k = 1; k < values.size(); ++k) {
      if (!values[k].sizes().equals(values[0].sizes())) {
        errors.push_back(absl::StrCat("model.tie '", text, "': the parameters' shapes differ (",
                                      c10::str(values[0].sizes()), " and ",
                                      c10::str(values[k].sizes()), ")"));
      } else if (!at::equal(values[k], values[0])) {
        errors.push_back(absl::StrCat("model.tie '", text,
                                      "': the parameters start with "
                                      "different values (save the model with them tied)"));
      }
    }
    if (group.size() == names.size()) groups.push_back(std::move(group));
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
  }
  return groups;
}

}  // namespace pipetrain::model
