// Models besides the GPT trained exactly as pipelines: GPipe's micro-batch BatchNorm against
// hand-computed statistics, a VGG-11 in 3 stages with and without replicas, and a model
// brought from Python as TorchScript (including its dropout under recomputation).
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "runtime/data/dataset.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/model/model_zoo.h"
#include "runtime/schedule/schedule.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

// GPipe's micro-batch BatchNorm: each micro-batch is normalized with its own statistics,
// and the running statistics move once per mini-batch, by the statistics of all its
// micro-batches together.
TEST(BatchNorm, MicroBatchStatisticsAndOneRunningUpdatePerMiniBatch) {
  JobSpec c;
  c.mutable_model()->set_name("cnn");
  c.mutable_model()->set_hidden(4);
  c.mutable_model()->set_hidden_layers(2);
  c.mutable_model()->clear_image_shape();
  for (int64_t d : {2, 6, 6}) c.mutable_model()->add_image_shape(d);
  c.mutable_model()->set_num_classes(3);
  c.mutable_data()->set_num_samples(256);
  SetSchedule(c, ScheduleKind::kGPipe);
  c.set_stages(2);
  c.set_microbatches(4);
  c.set_microbatch_size(3);
  c.set_steps(1);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("sgd");
  c.mutable_optimizer()->set_lr(0.1);
  SetPrecision(c, pipetrain::job::Precision::kFloat64);
  c.set_threads_per_stage(1);
  JobReport report = MustRun(c);

  model::ModelConfig mc = ModelConfigOf(c);
  mc.seed = c.seed();
  mc.float64 = true;
  auto layers = model::BuildModel(mc);
  ASSERT_TRUE(layers.ok());
  data::SyntheticClassificationOptions o;
  o.sample_shape = ModelConfigOf(c).image_shape;
  o.num_classes = 3;
  o.num_samples = c.data().num_samples();
  o.seed = c.data().seed();
  auto dataset = data::MakeSyntheticClassification(o);
  ASSERT_TRUE(dataset.ok());
  data::BatchSampler sampler((*dataset)->num_samples(), c.seed(), 1, 4, 3);
  auto to_tensor = [](const data::MicroBatch& mb) {
    return torch::tensor(mb.input_values).reshape(mb.input_shape).to(at::kDouble);
  };
  at::Tensor conv_w = (*layers)[0]->Parameters()[0];
  ASSERT_EQ(conv_w.dim(), 4);
  // Statistics of conv0's output over the whole mini-batch (unbiased variance).
  at::Tensor whole =
      at::conv2d(to_tensor((*dataset)->Read(sampler.GlobalBatchIds(0))), conv_w, {}, 1, 1).detach();
  at::Tensor mean = whole.mean({0, 2, 3});
  at::Tensor var = whole.var({0, 2, 3}, /*unbiased=*/true);
  // Buffers of conv0 come first: running_mean, running_var (initially 0 and 1).
  ASSERT_GE(report.final_buffers.size(), 2u);
  EXPECT_TRUE(at::allclose(report.final_buffers[0], 0.1 * mean, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(report.final_buffers[1], 0.9 + 0.1 * var, 1e-12, 1e-12));

  // Training-mode output of one micro-batch uses that micro-batch's own statistics.
  at::Tensor x0 = to_tensor((*dataset)->Read(sampler.SampleIds(0, 0, 0)));
  model::LayerContext ctx;
  ctx.recomputing = true;  // do not count this probe
  at::Tensor out = (*layers)[0]->Forward(x0, ctx).detach();
  at::Tensor y0 = at::conv2d(x0, conv_w, {}, 1, 1).detach();
  at::Tensor mb_mean = y0.mean({0, 2, 3}, true), mb_var = y0.var({0, 2, 3}, false, true);
  at::Tensor manual = at::relu((y0 - mb_mean) / at::sqrt(mb_var + 1e-5));
  EXPECT_TRUE(at::allclose(out, manual, 1e-9, 1e-9));
  EXPECT_FALSE(at::allclose(mb_mean.flatten(), mean, 1e-3, 1e-3));  // micro != mini stats
}

// A VGG-11 (conv3x3 + BatchNorm + ReLU, max pooling at the end of each stage) on 32x32
// images, cut into 3 pipeline stages under 1F1B, float64, with 1 and with 2 replicas: its
// parameters after 3 steps equal the un-pipelined run over the same global batch.
TEST(Vgg, PipelinedAndReplicatedEqualTheReference) {
  JobSpec c;
  c.mutable_model()->set_name("vgg");
  c.mutable_model()->set_hidden(2);
  c.mutable_model()->set_hidden_layers(11);
  c.mutable_model()->clear_image_shape();
  for (int64_t d : {3, 32, 32}) c.mutable_model()->add_image_shape(d);
  c.mutable_model()->set_num_classes(4);
  c.mutable_data()->set_num_samples(256);
  SetSchedule(c, ScheduleKind::kOneFOneB);
  c.set_stages(3);
  c.set_microbatches(3);
  c.set_microbatch_size(4);
  c.set_steps(3);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("sgd");
  c.mutable_optimizer()->set_lr(0.05);
  SetPrecision(c, pipetrain::job::Precision::kFloat64);
  c.set_threads_per_stage(1);
  for (int replicas : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << replicas << " replicas");
    c.set_replicas(replicas);
    JobReport report = MustRun(c);
    auto reference = MustReference(c);
    ASSERT_EQ(report.final_parameters.size(), reference.size());
    EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
    JobSpec untrained = c;
    untrained.mutable_optimizer()->set_lr(1e-12);
    EXPECT_GT(MaxRelativeDifference(MustReference(untrained), reference), 1e-4);
  }
}

// A model brought from Python: a TorchScript archive of an nn.Sequential (built here with
// the TorchScript compiler so the test needs no Python), including dropout.
std::string SaveScriptedSequential(const std::string& path) {
  torch::manual_seed(7);
  torch::jit::Module root("Sequential");
  root.register_attribute("training", c10::BoolType::get(), true);
  auto linear = [](const char* type, int64_t in, int64_t out, bool relu) {
    torch::jit::Module m(type);
    m.register_attribute("training", c10::BoolType::get(), true);
    m.register_parameter("weight", torch::randn({out, in}) / std::sqrt(double(in)), false);
    m.register_parameter("bias", torch::zeros({out}), false);
    m.define(std::string("def forward(self, x):\n  y = torch.matmul(x, self.weight.t()) + self.bias"
                         "\n  return ") +
             (relu ? "torch.relu(y)\n" : "y\n"));
    return m;
  };
  torch::jit::Module dropout("Dropout");
  dropout.register_attribute("training", c10::BoolType::get(), true);
  dropout.define("def forward(self, x):\n  return torch.dropout(x, 0.3, self.training)\n");
  root.register_module("0", linear("L0", 32, 24, true));
  root.register_module("1", dropout);
  root.register_module("2", linear("L1", 24, 24, true));
  root.register_module("3", linear("L2", 24, 10, false));
  root.save(path);
  return path;
}

TEST(TorchScript, SequentialChildrenAreLayersAndTrainExactly) {
  const std::string path = SaveScriptedSequential(::testing::TempDir() + "/seq.pt");
  JobSpec c = ScriptJob(path);
  JobReport report = MustRun(c);
  EXPECT_EQ(report.model_summary.rfind("torchscript: 4 layers", 0), 0u) << report.model_summary;
  auto reference = MustReference(c);
  EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-5);
  EXPECT_GT(report.losses.front(), report.losses.back());
  // Dropout inside TorchScript is replayed exactly under recomputation.
  SetRecompute(c, *ParseRecompute("all"));
  JobReport recomputed = MustRun(c);
  EXPECT_TRUE(BitwiseEqual(report.final_parameters, recomputed.final_parameters));
}

TEST(TorchScript, UnreadableFileIsAClearError) {
  JobSpec c = ScriptJob(::testing::TempDir() + "/does_not_exist.pt");
  auto report = RunInProcess(c);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(report.status().message().find("does_not_exist.pt"), std::string::npos);
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
