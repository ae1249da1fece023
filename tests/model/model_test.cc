// A rank builds only its own layers: proof that nothing is lost by it.
//
// - What model_config.h knows of a built-in model without building it (layer names,
//   parameter counts, output shapes) equals what building it and running it gives.
// - A layer's initial parameters are a function of (seed, global layer index, model config)
//   alone: bitwise the same under every partition, and the same as the whole model's.
// - Trained under uneven partitions, parameters still equal the un-pipelined reference.
// - A parameter shared within a stage module (tied layers on one rank) is one tensor, its
//   gradient folded into its owner's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "runtime/job/launch/in_process.h"
#include "runtime/job/plan.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/model/mixed_precision.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "tests/model/builtin_configs.h"

namespace pipetrain {
namespace {

using job::JobSpec;
using model::LayerRange;
using model::ModelConfig;

TEST(BuiltinModels, LayerNamesCountsAndShapesWithoutBuildingEqualTheBuiltModel) {
  for (const ModelConfig& c : BuiltinConfigs()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<std::vector<model::LayerInfo>> info = model::BuiltinLayers(c);
    ASSERT_TRUE(info.ok()) << info.status();
    absl::StatusOr<model::LayerList> layers = model::BuildModel(c);
    ASSERT_TRUE(layers.ok()) << layers.status();
    ASSERT_EQ(info->size(), layers->size());
    const std::vector<double> counts = model::ParameterCounts(*layers);
    at::Tensor x = SampleInput(c, 3);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < layers->size(); ++i) {
      SCOPED_TRACE((*info)[i].name);
      EXPECT_EQ((*info)[i].name, (*layers)[i]->name());
      EXPECT_EQ((*info)[i].num_parameters, static_cast<int64_t>(counts[i]));
      absl::StatusOr<std::vector<int64_t>> shape =
          model::BuiltinLayerOutputShape(c, static_cast<int>(i), x.sizes().vec());
      ASSERT_TRUE(shape.ok()) << shape.status();
      model::LayerContext ctx;
      ctx.global_layer = static_cast<int>(i);
      x = (*layers)[i]->Forward(x, ctx);
      EXPECT_EQ(*shape, x.sizes().vec());
    }
  }
}

TEST(BuiltinModels, ShapeOfAnInputThatDoesNotFitIsAnError) {
  ModelConfig c = BuiltinConfigs()[1];  // mlp, input_dim 5
  absl::StatusOr<std::vector<int64_t>> shape = model::BuiltinLayerOutputShape(c, 0, {3, 6});
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("[batch, 5]"), std::string::npos) << shape.status();
  EXPECT_FALSE(model::BuiltinLayerOutputShape(c, 9, {3, 5}).ok());
  c.name = "torchscript";
  EXPECT_EQ(model::BuiltinLayers(c).status().code(), absl::StatusCode::kFailedPrecondition);
}

// VGG's configurations: 8, 10, 13 and 16 convolutions (and a classifier) for depths 11, 13,
// 16 and 19; with hidden 64 the paper's widths (VGG-16: 14.7M convolution parameters); any
// other depth is refused naming the field.
TEST(BuiltinModels, VggHasThePapersConfigurations) {
  ModelConfig c;
  c.name = "vgg";
  c.image_shape = {3, 32, 32};
  c.hidden = 64;
  c.num_classes = 10;
  const std::pair<int, size_t> depths[] = {{11, 8}, {13, 10}, {16, 13}, {19, 16}};
  for (const auto& [depth, convs] : depths) {
    c.hidden_layers = depth;
    absl::StatusOr<std::vector<model::LayerInfo>> layers = model::BuiltinLayers(c);
    ASSERT_TRUE(layers.ok()) << layers.status();
    EXPECT_EQ(layers->size(), convs + 1) << depth;
    EXPECT_EQ(layers->back().name, "classifier");
  }
  c.hidden_layers = 16;
  absl::StatusOr<std::vector<model::LayerInfo>> vgg16 = model::BuiltinLayers(c);
  ASSERT_TRUE(vgg16.ok());
  int64_t conv_weights = 0;
  for (size_t i = 0; i + 1 < vgg16->size(); ++i) conv_weights += (*vgg16)[i].num_parameters;
  // torchvision's vgg16_bn: 14,714,688 convolution weights and biases; here no conv bias but
  // BatchNorm's weight and bias (2 x out instead of 1 x out per layer): 4,224 more.
  EXPECT_EQ(conv_weights, 14'714'688 + 4'224);
  // 32x32 pooled five times: the classifier gets [b, 512, 1, 1].
  std::vector<int64_t> shape = {4, 3, 32, 32};
  for (size_t i = 0; i + 1 < vgg16->size(); ++i) {
    absl::StatusOr<std::vector<int64_t>> next = model::BuiltinLayerOutputShape(c, i, shape);
    ASSERT_TRUE(next.ok()) << next.status();
    shape = *next;
  }
  EXPECT_EQ(shape, (std::vector<int64_t>{4, 512, 1, 1}));
  c.hidden_layers = 12;
  EXPECT_THAT(std::string(model::ValidateModelConfig(c).message()),
              ::testing::HasSubstr("model.hidden_layers must be 11, 13, 16 or 19 for vgg"));
}

// Mixed precision: inside a bfloat16 scope a matrix product of float32 tensors runs in
// bfloat16 and its gradient reaches the float32 weight as float32; scopes nest; outside, or
// in a float32 scope, nothing changes; a weight updated in place between two scopes is used
// as updated (no stale cast).
TEST(MixedPrecision, AScopeComputesInBFloat16OnFloat32Weights) {
  at::Tensor w = at::randn({4, 3}).requires_grad_(true);
  const at::Tensor x = at::randn({2, 4});
  {
    model::MixedPrecisionScope scope(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_TRUE(model::MixedPrecisionOnCpu());
    at::Tensor y = at::mm(x, w);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    {
      model::MixedPrecisionScope inner(c10::DeviceType::CPU, at::kBFloat16);
      EXPECT_EQ(at::mm(x, w).scalar_type(), at::kBFloat16);
    }
    EXPECT_TRUE(model::MixedPrecisionOnCpu());
    y.sum().backward();
  }
  EXPECT_FALSE(model::MixedPrecisionOnCpu());
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(at::mm(x, w).scalar_type(), at::kFloat);
  {
    model::MixedPrecisionScope none(c10::DeviceType::CPU, at::kFloat);
    EXPECT_FALSE(model::MixedPrecisionOnCpu());
    EXPECT_EQ(at::mm(x, w).scalar_type(), at::kFloat);
  }
  at::Tensor before, after;
  {
    model::MixedPrecisionScope scope(c10::DeviceType::CPU, at::kBFloat16);
    before = at::mm(x, w).detach();
  }
  {
    torch::NoGradGuard no_grad;
    w.mul_(2);
  }
  {
    model::MixedPrecisionScope scope(c10::DeviceType::CPU, at::kBFloat16);
    after = at::mm(x, w).detach();
  }
  EXPECT_TRUE(at::allclose(after.to(at::kFloat), 2 * before.to(at::kFloat), 1e-2, 1e-2));
}

// StageModule::ShareParameter: a tied GPT's head weight given the embedding's storage is
// one tensor (in a Clone too), outside OwnParameters(); its gradient folds into the owner's
// (the embedding's use + the head's); each refusal is named.
TEST(StageModuleSharing, TheHeadReadsTheEmbeddingsStorageAndItsGradientFoldsIntoIt) {
  ModelConfig c = BuiltinConfigs().front();
  ASSERT_EQ(c.name, "gpt");
  c.tie_embeddings = true;
  absl::StatusOr<model::LayerList> layers = model::BuildModel(c);
  ASSERT_TRUE(layers.ok()) << layers.status();
  model::StageModule module(0, *std::move(layers));
  const std::vector<at::Tensor> params = module.Parameters();
  const int head = static_cast<int>(params.size()) - 1;
  const auto refused = [&](int index, const at::Tensor& owner, const std::string& why) {
    const absl::Status s = module.ShareParameter(index, owner);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr(why));
  };
  refused(1, params[0], "cannot share the storage of");  // the position table: other shape
  refused(head + 1, params[0], "of a stage of");
  ASSERT_TRUE(module.ShareParameter(head, params[0]).ok());
  refused(head, params[0], "is shared already");
  refused(0, params[head], "cannot share a shared parameter");
  EXPECT_EQ(params[head].data_ptr(), params[0].data_ptr());
  EXPECT_TRUE(module.IsShared(head));
  ASSERT_EQ(module.OwnParameters().size(), params.size() - 1);
  EXPECT_TRUE(module.OwnParameters().back().is_same(params[head - 1]));

  module.Forward(SampleInput(c, 2), {}).sum().backward();
  const at::Tensor embedding_use = params[0].grad().clone(), head_use = params[head].grad().clone();
  module.FoldSharedGradients();
  EXPECT_FALSE(params[head].grad().defined());
  EXPECT_TRUE(at::equal(params[0].grad(), embedding_use + head_use));
  module.FoldSharedGradients();  // nothing more to fold
  EXPECT_TRUE(at::equal(params[0].grad(), embedding_use + head_use));

  const std::unique_ptr<model::StageModule> copy = module.Clone();
  const std::vector<at::Tensor> copied = copy->Parameters();
  EXPECT_EQ(copied[head].data_ptr(), copied[0].data_ptr());
  EXPECT_NE(copied[0].data_ptr(), params[0].data_ptr());
  EXPECT_EQ(copy->OwnParameters().size(), params.size() - 1);
}

TEST(LayerInit, EachLayerDependsOnlyOnSeedAndIndex) {
  for (const ModelConfig& base : BuiltinConfigs()) {
    SCOPED_TRACE(base.name);
    ModelConfig c = base;
    c.seed = 7;
    absl::StatusOr<model::LayerList> whole = model::BuildModel(c);
    ASSERT_TRUE(whole.ok()) << whole.status();
    const int n = static_cast<int>(whole->size());
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<model::LayerList> one = model::BuildLayers(c, i, i + 1);
      ASSERT_TRUE(one.ok()) << one.status();
      ASSERT_EQ(one->size(), 1u);
      const auto a = (*whole)[i]->Parameters(), b = (*one)[0]->Parameters();
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(a[k].equal(b[k])) << "layer " << i;
    }
    // Another seed gives other values (for every layer that draws any).
    c.seed = 8;
    absl::StatusOr<model::LayerList> other = model::BuildModel(c);
    ASSERT_TRUE(other.ok());
    EXPECT_FALSE((*whole)[0]->Parameters()[0].equal((*other)[0]->Parameters()[0]));
    // Two layers of the same kind are not initialized alike.
    const auto one = (*whole)[1]->Parameters(), two = (*whole)[2]->Parameters();
    bool differ = one.size() != two.size();
    for (size_t k = 0; !differ && k < one.size(); ++k) differ = !one[k].equal(two[k]);
    EXPECT_TRUE(differ);
  }
  EXPECT_FALSE(model::BuildLayers(BuiltinConfigs()[0], 2, 9).ok());
}

// A float64 GPT of 6 layers: embedding, block0..2, final_norm, lm_head.
JobSpec SmallGpt() {
  JobSpec c;
  c.mutable_model()->set_d_model(16);
  c.mutable_model()->set_n_heads(2);
  c.mutable_model()->set_n_layers(3);
  c.mutable_data()->set_vocab(16);
  c.mutable_data()->set_seq_len(8);
  c.mutable_data()->set_num_tokens(1 << 14);
  job::SetSchedule(c, schedule::ScheduleKind::kOneFOneB);
  c.set_microbatches(4);
  c.set_microbatch_size(2);
  c.set_steps(5);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("adamw");
  c.mutable_optimizer()->set_lr(1e-2);
  job::SetPrecision(c, pipetrain::job::Precision::kFloat64);
  c.set_threads_per_stage(1);
  c.set_timeout_s(60);
  return c;
}

// Every partition the proof runs over: p = 1, 2 and 4 balanced, and two uneven ones.
std::vector<std::vector<LayerRange>> Partitions() {
  return {{{0, 6}},
          {{0, 3}, {3, 6}},
          {{0, 2}, {2, 3}, {3, 4}, {4, 6}},
          {{0, 1}, {1, 5}, {5, 6}},
          {{0, 4}, {4, 5}, {5, 6}}};
}

// Layer i's initial parameters as stage `s` of `c`'s plan builds them.
std::vector<std::vector<at::Tensor>> InitialParametersByLayer(const JobSpec& c) {
  absl::StatusOr<job::JobPlan> plan = job::MakeJobPlan(c);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  std::vector<std::vector<at::Tensor>> by_layer;
  job::MicroBatchReader reader(*plan, c.microbatches());
  for (int s = 0; s < plan->stages(); ++s) {
    absl::StatusOr<job::StageParts> parts = job::BuildStage(c, *plan, reader, s);
    EXPECT_TRUE(parts.ok()) << parts.status();
    if (!parts.ok()) return {};
    int64_t bytes = 0;
    for (const auto& layer : parts->weights[0]->Newest().layers()) {
      by_layer.push_back(layer->Parameters());
      for (const at::Tensor& t : by_layer.back()) bytes += t.numel() * t.element_size();
    }
    EXPECT_EQ(parts->parameter_bytes, bytes) << "stage " << s;
    EXPECT_EQ(parts->weights[0]->Newest().first_layer(), plan->partition[s].begin);
  }
  return by_layer;
}

TEST(LayerInit, BitwiseEqualUnderEveryPartitionAndTrainingMatchesTheReference) {
  std::vector<std::vector<at::Tensor>> first;
  for (const std::vector<LayerRange>& partition : Partitions()) {
    JobSpec c = SmallGpt();
    job::SetStageRanges(c, partition);
    c.set_stages(static_cast<int>(partition.size()));
    SCOPED_TRACE(model::FormatRanges(partition));
    std::vector<std::vector<at::Tensor>> layers = InitialParametersByLayer(c);
    ASSERT_EQ(layers.size(), 6u);
    if (first.empty()) first = layers;
    for (size_t i = 0; i < layers.size(); ++i) {
      ASSERT_EQ(layers[i].size(), first[i].size());
      for (size_t k = 0; k < layers[i].size(); ++k) {
        EXPECT_TRUE(layers[i][k].equal(first[i][k])) << "layer " << i << " tensor " << k;
      }
    }
    // Five steps later the pipelined parameters still equal the un-pipelined run's.
    absl::StatusOr<job::JobReport> report = job::RunInProcess(c);
    ASSERT_TRUE(report.ok()) << report.status();
    absl::StatusOr<std::vector<at::Tensor>> reference = job::TrainReference(c);
    ASSERT_TRUE(reference.ok()) << reference.status();
    EXPECT_LE(job::MaxRelativeDifference(report->final_parameters, *reference), 1e-10);
    // Each stage reports its own parameter bytes; together they are the whole model's.
    int64_t bytes = 0;
    for (const job::StageReport& s : report->per_stage) {
      EXPECT_GT(s.parameter_bytes, 0);
      EXPECT_GT(s.peak_memory_bytes, 0);
      bytes += s.parameter_bytes;
    }
    int64_t whole = 0;
    for (const at::Tensor& t : *reference) whole += t.numel() * t.element_size();
    EXPECT_EQ(bytes, whole);
  }
}

}  // namespace
}  // namespace pipetrain
