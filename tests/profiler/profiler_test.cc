// The profiler measures what the planners are told: the counter counts exactly the tensors
// allocated; on the built-in GPT every layer's parameter bytes are its parameter count x 4,
// AdamW's state twice that, the blocks stash activations and the embedding and head hand on
// [b, T, d] and [b, T, vocab]; layers profiled one at a time allocate what they do in a run;
// messages and the AllReduce cost CPU; a second profile comes from the cache unchanged;
// profiles survive JSON and bad JSON names its field.
#include "runtime/profiler/profiler.h"

#include <filesystem>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/job/device.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/model/model_config.h"
#include "runtime/planner/profile_json.h"

namespace pipetrain::profiler {
namespace {

using ::testing::HasSubstr;

TEST(TensorMemory, CountsWhatIsAllocatedAndFreed) {
  memory::CountTensorMemory();
  ASSERT_TRUE(memory::CountingTensorMemory());
  const int64_t before = memory::TensorBytesInUse();
  memory::ResetPeakTensorBytes();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(memory::TensorBytesInUse() - before, 4000);
    at::Tensor b = at::empty({250}, at::kDouble);
    EXPECT_EQ(memory::TensorBytesInUse() - before, 6000);
  }
  EXPECT_EQ(memory::TensorBytesInUse(), before);
  EXPECT_EQ(memory::PeakTensorBytes() - before, 6000);
  memory::ResetPeakTensorBytes();
  EXPECT_EQ(memory::PeakTensorBytes(), before);
}

// The same figures by device: the CPU's are the counter's; a GPU's come from LibTorch's CUDA
// allocator where a GPU is visible, and are -1 (not known) where none is.
TEST(TensorMemory, ByDevice) {
  memory::CountTensorMemory();
  const c10::Device cpu(c10::DeviceType::CPU);
  memory::ResetPeakTensorBytesOn(cpu);
  const int64_t before = memory::TensorBytesInUseOn(cpu);
  EXPECT_EQ(before, memory::TensorBytesInUse());
  { at::Tensor a = at::empty({1000}, at::kFloat); }
  EXPECT_EQ(memory::PeakTensorBytesOn(cpu) - before, 4000);
  EXPECT_EQ(memory::PeakTensorBytesOn(cpu), memory::PeakTensorBytes());

  const c10::Device gpu(c10::DeviceType::CUDA, 0);
  if (job::VisibleCudaDevices() == 0) {
    EXPECT_EQ(memory::TensorBytesInUseOn(gpu), -1);
    EXPECT_EQ(memory::PeakTensorBytesOn(gpu), -1);
    memory::ResetPeakTensorBytesOn(gpu);  // does nothing
    return;
  }
  memory::ResetPeakTensorBytesOn(gpu);
  const int64_t on_gpu = memory::TensorBytesInUseOn(gpu);
  ASSERT_GE(on_gpu, 0);
  {
    at::Tensor a = at::empty({1 << 20}, at::TensorOptions(at::kFloat).device(gpu));
    EXPECT_GE(memory::TensorBytesInUseOn(gpu) - on_gpu, 4 << 20);
  }
  EXPECT_GE(memory::PeakTensorBytesOn(gpu) - on_gpu, 4 << 20);
  memory::ResetPeakTensorBytesOn(gpu);
  EXPECT_EQ(memory::PeakTensorBytesOn(gpu), memory::TensorBytesInUseOn(gpu));
}

job::JobSpec SmallGpt() {
  job::JobSpec config;
  config.mutable_model()->set_name("gpt");
  config.mutable_model()->set_d_model(32);
  config.mutable_model()->set_n_heads(2);
  config.mutable_model()->set_n_layers(2);
  config.mutable_data()->set_seq_len(16);
  config.set_microbatch_size(4);
  return config;
}

TEST(Profiler, MeasuresEveryLayerOfTheBuiltInGpt) {
  const std::string cache = ::testing::TempDir() + "/profiles";
  std::filesystem::remove_all(cache);
  job::JobSpec config = SmallGpt();
  ProfileOptions options;
  options.micro_batch_sizes = {2, 4};
  options.cache_dir = cache;
  std::vector<std::string> lines;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  absl::StatusOr<planner::ModelProfile> profile = ProfileJob(config, options);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->sizes.size(), 2u);
  EXPECT_EQ(profile->tokens_per_sample, 16);
  EXPECT_EQ(profile->dtype, "float32");
  model::ModelConfig model_config = job::ModelConfigOf(config);
  model_config.seq_len = config.data().seq_len();  // as the plan sizes it from the data
  absl::StatusOr<std::vector<model::LayerInfo>> infos = model::BuiltinLayers(model_config);
  ASSERT_TRUE(infos.ok());
  const int64_t vocab = 64;  // the built-in corpus's
  for (const planner::MicroBatchProfile& size : profile->sizes) {
    SCOPED_TRACE("b=" + std::to_string(size.micro_batch_size));
    const int64_t b = size.micro_batch_size;
    ASSERT_EQ(size.layers.size(), infos->size());  // embedding, 2 blocks, final_norm, lm_head
    for (size_t l = 0; l < size.layers.size(); ++l) {
      const planner::LayerProfile& layer = size.layers[l];
      SCOPED_TRACE(layer.name);
      EXPECT_EQ(layer.name, (*infos)[l].name);
      EXPECT_GT(layer.forward_s, 0);
      EXPECT_GT(layer.backward_s, 0);
      EXPECT_EQ(layer.parameter_bytes, 4 * (*infos)[l].num_parameters);
      EXPECT_EQ(layer.optimizer_bytes, 2 * layer.parameter_bytes);  // AdamW: exp_avg, exp_avg_sq
      EXPECT_GT(layer.optimizer_s, 0);
      const int64_t width = l + 1 == size.layers.size() ? vocab : 32;
      EXPECT_EQ(layer.output_bytes, 4 * b * 16 * width);
      // The split backward's W: every layer has parameters and defers their gradients (the
      // linear products, and the embedding and the norms on the generic path). The
      // embedding's input has no gradient: its whole backward is W. Otherwise W is at most
      // the backward, give or take the generic path's nested autograd call (tens of
      // microseconds, against a norm's backward of about as much).
      EXPECT_GT(layer.weight_gradient_s, 0);
      if (layer.name != "embedding") EXPECT_LE(layer.weight_gradient_s, layer.backward_s + 1e-4);
    }
    // A block keeps far more than its output for its backward (attention scores, MLP
    // activations): at least the 4d-wide MLP hidden layer.
    EXPECT_GT(size.layers[1].stash_bytes, 4 * b * 16 * 4 * 32);
  }
  // Twice the micro-batch, twice the activations.
  EXPECT_EQ(profile->sizes[1].layers[1].output_bytes, 2 * profile->sizes[0].layers[1].output_bytes);
  EXPECT_GT(profile->p2p.bytes_per_s, 1e6);
  EXPECT_GT(profile->allreduce.bytes_per_s, 1e6);
  EXPECT_GT(profile->allreduce_cpu.bytes_per_s, 1e6);
  // Messages between busy ranks, from 256 bytes to 8 MiB: every one costs its sender and its
  // receiver some CPU, and takes longer on the way the larger it is.
  ASSERT_EQ(profile->message_costs.size(), 6u);
  for (size_t i = 0; i < profile->message_costs.size(); ++i) {
    const planner::MessageCost& c = profile->message_costs[i];
    EXPECT_GT(c.send_s, 0) << c.bytes;
    EXPECT_GT(c.recv_s, 0) << c.bytes;
    EXPECT_GT(c.latency_s, 0) << c.bytes;
    if (i > 0) {
      EXPECT_GT(c.bytes, profile->message_costs[i - 1].bytes);
    }
  }
  EXPECT_GT(profile->message_costs.back().latency_s, profile->message_costs.front().latency_s);
  EXPECT_FALSE(lines.empty());

  // Again: everything from the cache, equal.
  lines.clear();
  absl::StatusOr<planner::ModelProfile> again = ProfileJob(config, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(planner::ModelProfileToJson(*again), planner::ModelProfileToJson(*profile));
  EXPECT_THAT(lines, ::testing::Contains(HasSubstr("from the cache")));
  // A different model is measured, not served from the cache.
  config.mutable_model()->set_d_model(48);
  options.micro_batch_sizes = {2};
  options.measure_links = false;
  absl::StatusOr<planner::ModelProfile> wider = ProfileJob(config, options);
  ASSERT_TRUE(wider.ok());
  EXPECT_GT(wider->sizes[0].layers[1].parameter_bytes, profile->sizes[0].layers[1].parameter_bytes);
}

// Layers run together as in a stage, or one at a time when the memory budget allows no more:
// what each keeps, hands on and allocates is the same either way.
TEST(Profiler, LayersProfiledAloneAllocateWhatTheyDoInARun) {
  job::JobSpec config = SmallGpt();
  ProfileOptions together;
  together.micro_batch_sizes = {4};
  together.measure_links = false;
  ProfileOptions alone = together;
  alone.memory_budget_bytes = 1;  // one layer at a time
  absl::StatusOr<planner::ModelProfile> a = ProfileJob(config, together);
  absl::StatusOr<planner::ModelProfile> b = ProfileJob(config, alone);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->sizes[0].layers.size(), b->sizes[0].layers.size());
  for (size_t l = 0; l < a->sizes[0].layers.size(); ++l) {
    const planner::LayerProfile& x = a->sizes[0].layers[l];
    const planner::LayerProfile& y = b->sizes[0].layers[l];
    SCOPED_TRACE(x.name);
    EXPECT_EQ(x.output_bytes, y.output_bytes);
    EXPECT_EQ(x.parameter_bytes, y.parameter_bytes);
    EXPECT_EQ(x.optimizer_bytes, y.optimizer_bytes);
    EXPECT_EQ(x.stash_bytes, y.stash_bytes);
    EXPECT_EQ(x.working_bytes, y.working_bytes);
    EXPECT_GT(y.forward_s, 0);
    EXPECT_GT(y.backward_s, 0);
  }
}

TEST(Profiler, ProfilesSurviveJsonAndBadJsonNamesTheField) {
  planner::ModelProfile p;
  p.model = "m";
  p.p2p = {1e-5, 2e9};
  p.allreduce = {2e-5, 1e9};
  p.allreduce_cpu = {3e-5, 5e8};
  p.message_costs = {{256, 1e-5, 2e-5, 3e-5, 4e-5}, {4096, 2e-5, 3e-5, 4e-5, 5e-5}};
  planner::MicroBatchProfile size;
  size.micro_batch_size = 3;
  size.layers.push_back({"a", 0.1, 0.2, 0.01, 10, 20, 40, 30, 5});
  size.layers.push_back({"b", 0.1, 0.2, 0.01, 10, 20, 40, 30, 5, 0.05});  // W measured
  p.sizes.push_back(size);
  absl::StatusOr<planner::ModelProfile> back =
      planner::ModelProfileFromJson(planner::ModelProfileToJson(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(planner::ModelProfileToJson(*back), planner::ModelProfileToJson(p));
  EXPECT_EQ(back->sizes[0].layers[0].weight_gradient_s, -1);  // not measured: absent
  EXPECT_EQ(back->sizes[0].layers[1].weight_gradient_s, 0.05);
  std::string bad = planner::ModelProfileToJson(p);
  bad.replace(bad.find("\"forward_s\":0.1"), 15, "\"forward_s\":-1");
  EXPECT_THAT(planner::ModelProfileFromJson(bad).status().message(),
              HasSubstr("sizes[0].layers[0].forward_s: must be finite and >= 0"));
  EXPECT_FALSE(planner::ModelProfileFromJson("{").ok());
  std::string descending = planner::ModelProfileToJson(p);
  descending.replace(descending.find("\"bytes\":4096"), 12, "\"bytes\":255");
  EXPECT_THAT(planner::ModelProfileFromJson(descending).status().message(),
              HasSubstr("message_costs[1].bytes: sizes must ascend"));
  // The machine's part alone (what is cached once per machine) replaces only that part.
  planner::ModelProfile other;
  other.model = "other";
  ASSERT_TRUE(planner::MachineProfileFromJson(planner::MachineProfileToJson(p), &other).ok());
  EXPECT_EQ(other.model, "other");
  EXPECT_EQ(planner::MachineProfileToJson(other), planner::MachineProfileToJson(p));
}

TEST(Profiler, BadOptionsAreRefused) {
  ProfileOptions options;
  options.threads = 0;
  EXPECT_FALSE(ProfileJob(SmallGpt(), options).ok());
  options.threads = 1;
  options.micro_batch_sizes = {0};
  options.measure_links = false;
  EXPECT_FALSE(ProfileJob(SmallGpt(), options).ok());
}

}  // namespace
}  // namespace pipetrain::profiler
