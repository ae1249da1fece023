// A layer's checkpoint file round-trips parameters, buffers and optimizer state bitwise; a
// stage's weights split by layer load into a stage of another partition; a mismatch is
// refused before anything changes.
#include "runtime/checkpoint/layer_state.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/model/model_zoo.h"
#include "runtime/weights/optimizer.h"

namespace pipetrain::checkpoint {
namespace {

using ::testing::HasSubstr;

model::ModelConfig Cnn() {
  model::ModelConfig c;
  c.name = "cnn";  // BatchNorm: buffers too
  c.float64 = true;
  c.seed = 3;
  c.hidden = 8;
  c.hidden_layers = 2;
  c.image_shape = {3, 8, 8};
  return c;
}

std::unique_ptr<model::StageModule> Stage(int begin, int end, uint64_t seed = 3) {
  model::ModelConfig c = Cnn();
  c.seed = seed;
  auto layers = model::BuildLayers(c, begin, end);
  EXPECT_TRUE(layers.ok()) << layers.status();
  return std::make_unique<model::StageModule>(begin, *std::move(layers));
}

bool Equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

TEST(LayerState, AFileRoundTripsBitwise) {
  LayerState s;
  s.parameters = {at::randn({3, 4}, at::kDouble), at::randn({4}, at::kDouble)};
  s.buffers = {at::randn({4}, at::kDouble)};
  s.optimizer = {{{"step", at::scalar_tensor(7, at::kLong)},
                  {"exp_avg", at::randn({3, 4}, at::kDouble)},
                  {"exp_avg_sq", at::rand({3, 4}, at::kDouble)}},
                 {}};
  auto back = ParseLayerState(SerializeLayerState(s));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->parameters.size(), 2u);
  for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(Equal(back->parameters[k], s.parameters[k]));
  EXPECT_TRUE(Equal(back->buffers[0], s.buffers[0]));
  EXPECT_EQ(back->optimizer[0].at("step").item<int64_t>(), 7);
  EXPECT_TRUE(Equal(back->optimizer[0].at("exp_avg_sq"), s.optimizer[0].at("exp_avg_sq")));
  EXPECT_TRUE(back->optimizer[1].empty());
  EXPECT_EQ(ParseLayerState("not a pickle").status().code(), absl::StatusCode::kDataLoss);
}

// Weights trained a step as one stage [0, n) load, layer by layer, into two stages of
// another partition, optimizer state included.
TEST(LayerState, AStagesLayersLoadIntoAnotherPartition) {
  auto whole = Stage(0, -1);
  const int n = whole->num_layers();
  ASSERT_GE(n, 3);
  auto adamw = weights::MakeOptimizer({"adamw", 1e-2});
  ASSERT_TRUE(adamw.ok());
  auto store = weights::MakeSingleVersionWeights(std::move(whole), *std::move(adamw));
  ASSERT_TRUE(store.ok());
  auto* module = *(*store)->ModuleFor(0);
  at::Tensor x = at::randn({2, 3, 8, 8}, at::kDouble);
  module->Forward(x, {}).sum().backward();
  ASSERT_TRUE((*store)->Update(0).ok());
  const std::vector<LayerState> states = StageLayerStates(**store);
  ASSERT_EQ(static_cast<int>(states.size()), n);

  const int cut = n / 2;
  auto first = Stage(0, cut, /*seed=*/99), second = Stage(cut, n, /*seed=*/99);
  auto optimizer_first = LoadLayerStates({states.begin(), states.begin() + cut}, first.get());
  auto optimizer_second = LoadLayerStates({states.begin() + cut, states.end()}, second.get());
  ASSERT_TRUE(optimizer_first.ok()) << optimizer_first.status();
  ASSERT_TRUE(optimizer_second.ok()) << optimizer_second.status();
  std::vector<at::Tensor> loaded = first->Parameters(), more = second->Parameters();
  loaded.insert(loaded.end(), more.begin(), more.end());
  const std::vector<at::Tensor> trained = (*store)->Newest().Parameters();
  ASSERT_EQ(loaded.size(), trained.size());
  for (size_t k = 0; k < loaded.size(); ++k) EXPECT_TRUE(Equal(loaded[k], trained[k])) << k;
  std::vector<at::Tensor> buffers = first->Buffers(), more_buffers = second->Buffers();
  buffers.insert(buffers.end(), more_buffers.begin(), more_buffers.end());
  const std::vector<at::Tensor> trained_buffers = (*store)->Newest().Buffers();
  ASSERT_EQ(buffers.size(), trained_buffers.size());
  ASSERT_FALSE(buffers.empty());
  for (size_t k = 0; k < buffers.size(); ++k) EXPECT_TRUE(Equal(buffers[k], trained_buffers[k]));
  const auto state = (*store)->OptimizerState();
  ASSERT_EQ(optimizer_first->size() + optimizer_second->size(), state.size());
  EXPECT_TRUE(Equal(optimizer_first->front().at("exp_avg"), state.front().at("exp_avg")));
  EXPECT_EQ(optimizer_second->back().at("step").item<int64_t>(), 1);
}

TEST(LayerState, AMismatchIsRefusedBeforeAnythingChanges) {
  auto stage = Stage(0, 2);
  const std::vector<at::Tensor> before = stage->Parameters();
  std::vector<at::Tensor> copies;
  for (const at::Tensor& p : before) copies.push_back(p.clone());
  auto store =
      weights::MakeSingleVersionWeights(Stage(0, 2, 5), *weights::MakeOptimizer({"sgd", 0.1}));
  std::vector<LayerState> states = StageLayerStates(**store);
  states[1].parameters[0] = states[1].parameters[0].to(at::kFloat);
  auto refused = LoadLayerStates(states, stage.get());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("layer 1 parameter 0"));
  for (size_t k = 0; k < before.size(); ++k)
    EXPECT_TRUE(Equal(before[k], copies[k]));  // layer 0 too
  states.pop_back();
  EXPECT_THAT(LoadLayerStates(states, stage.get()).status().message(),
              HasSubstr("the stage has 2 layers; the checkpoint gave 1"));
}

}  // namespace
}  // namespace pipetrain::checkpoint
