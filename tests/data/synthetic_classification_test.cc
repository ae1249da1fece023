#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/dataset.h"

namespace pipetrain::data {
namespace {

std::unique_ptr<Dataset> Make(const SyntheticClassificationOptions& opts) {
  auto ds = MakeSyntheticClassification(opts);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return ds.ok() ? std::move(*ds) : nullptr;
}

TEST(SyntheticClassificationTest, ShapesForVectorData) {
  const auto ds = Make(SyntheticClassificationOptions{});
  ASSERT_NE(ds, nullptr);
  EXPECT_FALSE(ds->is_token_data());
  EXPECT_EQ(ds->num_samples(), 1 << 16);
  EXPECT_EQ(ds->num_classes(), 10);
  EXPECT_EQ(ds->sample_shape(), std::vector<int64_t>{32});
  EXPECT_FALSE(ds->entropy_nats().has_value());
  EXPECT_EQ(ds->Describe(), "synthetic classification (shape [32], 10 classes, 65536 samples)");
  const MicroBatch b = ds->Read({4, 2, 9});
  EXPECT_EQ(b.input_shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(b.input_values.size(), 96u);
  EXPECT_TRUE(b.input_tokens.empty());
  EXPECT_EQ(b.target_shape, std::vector<int64_t>{3});
  EXPECT_EQ(b.targets.size(), 3u);
}

TEST(SyntheticClassificationTest, ShapesForImageData) {
  SyntheticClassificationOptions opts;
  opts.sample_shape = {3, 4, 5};
  opts.num_classes = 7;
  opts.num_samples = 100;
  const auto ds = Make(opts);
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->sample_shape(), (std::vector<int64_t>{3, 4, 5}));
  const MicroBatch b = ds->Read({0, 99});
  EXPECT_EQ(b.input_shape, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(b.input_values.size(), 2u * 60u);
  EXPECT_EQ(b.target_shape, std::vector<int64_t>{2});
}

TEST(SyntheticClassificationTest, DeterministicPerSampleId) {
  SyntheticClassificationOptions opts;
  const auto a = Make(opts);
  const auto b = Make(opts);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const MicroBatch alone = a->Read({5});
  // Same id: same row, whatever the batch around it, the order, or the instance.
  const MicroBatch mixed = b->Read({7, 5, 5});
  const std::vector<float> row1(mixed.input_values.begin() + 32, mixed.input_values.begin() + 64);
  const std::vector<float> row2(mixed.input_values.begin() + 64, mixed.input_values.end());
  EXPECT_EQ(row1, alone.input_values);
  EXPECT_EQ(row2, alone.input_values);
  EXPECT_EQ(mixed.targets[1], alone.targets[0]);
  EXPECT_EQ(mixed.targets[2], alone.targets[0]);
  // A different id gives a different row.
  const std::vector<float> row0(mixed.input_values.begin(), mixed.input_values.begin() + 32);
  EXPECT_NE(row0, alone.input_values);
  // A different seed gives different data.
  opts.seed = 99;
  const auto c = Make(opts);
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c->Read({5}).input_values, alone.input_values);
}

TEST(SyntheticClassificationTest, StandardNormalInputsAndVariedLabels) {
  const auto ds = Make(SyntheticClassificationOptions{});
  ASSERT_NE(ds, nullptr);
  std::vector<int64_t> ids(4000);
  std::iota(ids.begin(), ids.end(), int64_t{1000});
  const MicroBatch b = ds->Read(ids);
  double sum = 0.0, sum_sq = 0.0;
  for (float v : b.input_values) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(b.input_values.size());  // 128000
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(sum_sq / n - mean * mean, 1.0, 0.02);

  std::vector<int64_t> histogram(10, 0);
  for (int64_t label : b.targets) {
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++histogram[static_cast<size_t>(label)];
  }
  // Not all equal; a random linear teacher uses every class for some inputs.
  int used = 0;
  for (int64_t count : histogram) used += count > 0;
  EXPECT_GE(used, 5);
  EXPECT_LT(*std::max_element(histogram.begin(), histogram.end()), 4000 / 2);
}

TEST(SyntheticClassificationTest, LabelsAreAFunctionOfTheInput) {
  // Two datasets that share the seed but differ in size use the same teacher and the same
  // per-id inputs, so they agree on every common id.
  SyntheticClassificationOptions opts;
  opts.num_samples = 50;
  const auto small = Make(opts);
  opts.num_samples = 5000;
  const auto large = Make(opts);
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  std::vector<int64_t> ids(50);
  std::iota(ids.begin(), ids.end(), int64_t{0});
  const MicroBatch a = small->Read(ids);
  const MicroBatch b = large->Read(ids);
  EXPECT_EQ(a.input_values, b.input_values);
  EXPECT_EQ(a.targets, b.targets);
}

TEST(SyntheticClassificationTest, RejectsBadOptions) {
  SyntheticClassificationOptions opts;
  opts.sample_shape = {};
  EXPECT_EQ(MakeSyntheticClassification(opts).status().code(), absl::StatusCode::kInvalidArgument);
  opts.sample_shape = {3, 0, 2};
  EXPECT_EQ(MakeSyntheticClassification(opts).status().code(), absl::StatusCode::kInvalidArgument);
  opts = SyntheticClassificationOptions{};
  opts.num_classes = 1;
  EXPECT_EQ(MakeSyntheticClassification(opts).status().code(), absl::StatusCode::kInvalidArgument);
  opts = SyntheticClassificationOptions{};
  opts.num_samples = 0;
  EXPECT_EQ(MakeSyntheticClassification(opts).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::data
