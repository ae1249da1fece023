// Per-parameter weight decay (optimizer.no_decay, docs/design.md section 4.7c):
// - every parameter of the built-in GPT and CNN is of the kinds listed here by hand, and a
//   TorchScript model's by its modules' classes and its parameters' names;
// - float64 parameters equal torch.optim's with two parameter groups (weight_decay 0 for the
//   kinds named) within 1e-10, under every schedule kind with 2 replicas, each kind meeting
//   SGD and AdamW, each set of kinds, tied embeddings and not; negative control: the one-group
//   reference differs;
// - an unknown kind is named with the known ones.
#include <gtest/gtest.h>

#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "jobspec/spec_yaml.h"
#include "runtime/job/job_spec.h"
#include "runtime/model/model_zoo.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

using model::KindBit;
using model::ParameterKind;
using model::ParameterKinds;

constexpr ParameterKinds kBias = KindBit(ParameterKind::kBias);
constexpr ParameterKinds kNorm = KindBit(ParameterKind::kNorm);
constexpr ParameterKinds kEmbedding = KindBit(ParameterKind::kEmbedding);

// Every layer's kinds, in order.
std::vector<std::vector<ParameterKinds>> KindsOfModel(const model::ModelConfig& config) {
  auto layers = model::BuildModel(config);
  EXPECT_TRUE(layers.ok()) << layers.status();
  std::vector<std::vector<ParameterKinds>> out;
  if (!layers.ok()) return out;
  for (const auto& layer : *layers) {
    out.push_back(layer->ParameterKindsOf());
    EXPECT_EQ(out.back().size(), layer->Parameters().size()) << layer->name();
  }
  return out;
}

TEST(ParameterKinds, TheBuiltInModelsNameEveryParameter) {
  model::ModelConfig gpt;
  gpt.n_layers = 1;
  // embedding (token, position) | block: ln1 w/b, qkv w/b, proj w/b, ln2 w/b, fc w/b, fc2 w/b
  // | final_norm (weight, bias) | lm_head (weight).
  const std::vector<std::vector<ParameterKinds>> expected_gpt = {
      {kEmbedding, kEmbedding},
      {kNorm, kNorm | kBias, 0, kBias, 0, kBias, kNorm, kNorm | kBias, 0, kBias, 0, kBias},
      {kNorm, kNorm | kBias},
      {0}};
  EXPECT_EQ(KindsOfModel(gpt), expected_gpt);
  model::ModelConfig cnn;
  cnn.name = "cnn";
  cnn.hidden_layers = 1;
  // conv (kernel, BatchNorm weight and bias) | classifier (weight, bias).
  const std::vector<std::vector<ParameterKinds>> expected_cnn = {{0, kNorm, kNorm | kBias},
                                                                 {0, kBias}};
  EXPECT_EQ(KindsOfModel(cnn), expected_cnn);
  model::ModelConfig mlp;
  mlp.name = "mlp";
  mlp.hidden_layers = 1;
  EXPECT_EQ(KindsOfModel(mlp), (std::vector<std::vector<ParameterKinds>>{{0, kBias}, {0, kBias}}));
}

// A TorchScript layer: kinds by the class of the module holding each parameter ("Norm",
// "Embedding" in its name) and by the parameter's name ("bias").
TEST(ParameterKinds, ATorchScriptModelsByItsModulesClassesAndParameterNames) {
  torch::jit::Module root("Sequential");
  root.register_attribute("training", c10::BoolType::get(), true);
  auto module = [](const char* type, std::vector<const char*> parameters) {
    torch::jit::Module m(type);
    m.register_attribute("training", c10::BoolType::get(), true);
    for (const char* p : parameters) m.register_parameter(p, torch::ones({4}), false);
    return m;
  };
  torch::jit::Module block("Block");
  block.register_attribute("training", c10::BoolType::get(), true);
  block.register_module("norm", module("RMSNorm", {"weight"}));
  block.register_module("proj", module("Linear", {"weight", "bias"}));
  block.define(
      "def forward(self, x):\n  return x * self.norm.weight * self.proj.weight + "
      "self.proj.bias\n");
  torch::jit::Module embedding = module("Embedding", {"weight"});
  embedding.define("def forward(self, x):\n  return x * self.weight\n");
  torch::jit::Module norm = module("LayerNorm", {"weight", "bias"});
  norm.define("def forward(self, x):\n  return x * self.weight + self.bias\n");
  root.register_module("0", embedding);
  root.register_module("1", block);
  root.register_module("2", norm);
  const std::string path = ::testing::TempDir() + "/kinds.pt";
  root.save(path);
  model::ModelConfig script;
  script.name = "torchscript";
  script.torchscript_path = path;
  const std::vector<std::vector<ParameterKinds>> expected = {
      {kEmbedding}, {kNorm, 0, kBias}, {kNorm, kNorm | kBias}};
  EXPECT_EQ(KindsOfModel(script), expected);
}

JobSpec Decayed(const ScheduleCase& k, const char* optimizer, ParameterKinds no_decay) {
  JobSpec c = TinyGpt(k, 4);
  c.set_replicas(2);
  c.set_steps(5);
  c.mutable_optimizer()->set_name(optimizer);
  c.mutable_optimizer()->set_lr(std::string(optimizer) == "sgd" ? 0.1 : 0.02);
  c.mutable_optimizer()->set_weight_decay(
      0.5);  // large: the groups' difference shows within 5 steps
  for (model::ParameterKind kind : model::kAllParameterKinds) {
    if (no_decay & model::KindBit(kind)) {
      c.mutable_optimizer()->add_no_decay(std::string(model::ParameterKindName(kind)));
    }
  }
  return c;
}

TEST(WeightDecayGroups, EqualTorchOptimWithTwoParameterGroups) {
  const std::vector<ScheduleCase> kinds = EveryScheduleKind(3);
  const ParameterKinds sets[] = {kBias | kNorm, kEmbedding, kBias | kNorm | kEmbedding};
  for (size_t i = 0; i < kinds.size(); ++i) {
    const ScheduleCase& k = kinds[i];
    const ScheduleKind kind = k.kind;
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (size_t n = 0; n < std::size(sets); ++n) {
        const ParameterKinds no_decay = sets[n];
        for (const bool tied : {false, true}) {
          // Three of the twelve a kind: every set of kinds once, the optimizer and the tie
          // turning with the set and the kind (every kind meets both optimizers and both).
          const bool adamw = std::string(optimizer) == "adamw";
          if (adamw != ((i + n) % 2 == 1) || tied != ((i + n + 1) % 2 == 1)) continue;
          SCOPED_TRACE(absl::StrCat(std::string(schedule::ScheduleKindName(kind)), " ", optimizer,
                                    " no_decay ", model::ParameterKindsName(no_decay),
                                    tied ? " tied" : ""));
          JobSpec c = Decayed(k, optimizer, no_decay);
          c.mutable_model()->set_tie_embeddings(tied);
          const JobReport report = MustRun(c);
          const std::vector<at::Tensor> reference = MustReference(c);
          ASSERT_EQ(report.final_parameters.size(), reference.size());
          EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
          // Negative control: every parameter decayed (one group) is another trajectory.
          JobSpec one_group = c;
          one_group.mutable_optimizer()->clear_no_decay();
          EXPECT_GT(MaxRelativeDifference(report.final_parameters, MustReference(one_group)), 1e-6);
        }
      }
    }
  }
}

TEST(WeightDecayGroups, AnUnknownKindIsNamedWithTheKnownOnes) {
  auto spec = jobspec::JobSpecFromYaml("optimizer: {no_decay: [bias, layernorm]}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto config = job::Validated(*spec);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("optimizer.no_decay: unknown parameter kind "
                                           "'layernorm' (one of: bias, norm, embedding)"),
            std::string::npos)
      << config.status();
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
