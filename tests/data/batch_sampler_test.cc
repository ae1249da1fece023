#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/dataset.h"

namespace pipetrain::data {
namespace {

std::vector<int64_t> Sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The concatenation of SampleIds over replicas and micro-batches, replica-major.
std::vector<int64_t> UnionOfShards(const BatchSampler& s, int64_t step, int w, int m) {
  std::vector<int64_t> all;
  for (int r = 0; r < w; ++r) {
    for (int i = 0; i < m; ++i) {
      const std::vector<int64_t> ids = s.SampleIds(step, r, i);
      all.insert(all.end(), ids.begin(), ids.end());
    }
  }
  return all;
}

TEST(BatchSamplerTest, GlobalBatchSize) {
  EXPECT_EQ(BatchSampler(100, 1, 2, 3, 4).global_batch_size(), 24);
  EXPECT_EQ(BatchSampler(100, 1, 2, 3, 4).SampleIds(0, 1, 2).size(), 4u);
  EXPECT_EQ(BatchSampler(100, 1, 2, 3, 4).GlobalBatchIds(7).size(), 24u);
}

TEST(BatchSamplerTest, ShardsUnionToGlobalBatchWhateverTheFactorization) {
  struct Shape {
    int w, m, b;
  };
  // B = 16 throughout; N = 100 is not a multiple of 16, so batches straddle epochs.
  const Shape shapes[] = {{2, 2, 4}, {1, 4, 4}, {4, 1, 4}, {1, 1, 16}, {2, 4, 2}, {16, 1, 1}};
  const BatchSampler reference(100, 42, 1, 1, 16);
  for (int64_t step = 0; step < 40; ++step) {
    const std::vector<int64_t> global = reference.GlobalBatchIds(step);
    ASSERT_EQ(global.size(), 16u);
    for (const Shape& sh : shapes) {
      const BatchSampler s(100, 42, sh.w, sh.m, sh.b);
      ASSERT_EQ(s.global_batch_size(), 16);
      const std::vector<int64_t> shards = UnionOfShards(s, step, sh.w, sh.m);
      EXPECT_EQ(Sorted(shards), Sorted(global))
          << "step " << step << " w " << sh.w << " m " << sh.m << " b " << sh.b;
      // In fact the same sequence: replica-major, micro-batch-major.
      EXPECT_EQ(shards, global);
      EXPECT_EQ(s.GlobalBatchIds(step), global);
    }
  }
}

TEST(BatchSamplerTest, EachEpochIsAPermutation) {
  // N = 10, B = 4: the stream of steps 0..4 is two whole epochs.
  const BatchSampler s(10, 3, 2, 1, 2);
  std::vector<int64_t> stream;
  for (int64_t step = 0; step < 5; ++step) {
    const std::vector<int64_t> ids = s.GlobalBatchIds(step);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  std::vector<int64_t> identity(10);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  const std::vector<int64_t> epoch0(stream.begin(), stream.begin() + 10);
  const std::vector<int64_t> epoch1(stream.begin() + 10, stream.end());
  EXPECT_EQ(Sorted(epoch0), identity);
  EXPECT_EQ(Sorted(epoch1), identity);
  EXPECT_NE(epoch0, epoch1);  // reshuffled each epoch
  EXPECT_NE(epoch0, identity);

  // Larger: no id repeats within any of several epochs of 1000 samples (B = 24 does not
  // divide 1000).
  const BatchSampler big(1000, 5, 2, 3, 4);
  std::vector<int64_t> long_stream;
  for (int64_t step = 0; step * 24 < 3000; ++step) {
    const std::vector<int64_t> ids = big.GlobalBatchIds(step);
    long_stream.insert(long_stream.end(), ids.begin(), ids.end());
  }
  for (int e = 0; e < 3; ++e) {
    const std::set<int64_t> seen(long_stream.begin() + e * 1000,
                                 long_stream.begin() + (e + 1) * 1000);
    EXPECT_EQ(seen.size(), 1000u) << "epoch " << e;
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 999);
  }
}

TEST(BatchSamplerTest, DeterministicBySeed) {
  const BatchSampler a(500, 11, 2, 2, 8);
  const BatchSampler b(500, 11, 2, 2, 8);
  const BatchSampler c(500, 12, 2, 2, 8);
  // Query b in a different order (later epochs first): results depend on (seed, step) only.
  for (int64_t step = 60; step >= 0; --step) {
    EXPECT_EQ(a.GlobalBatchIds(step), b.GlobalBatchIds(step)) << step;
  }
  int differing = 0;
  for (int64_t step = 0; step < 10; ++step) {
    differing += a.GlobalBatchIds(step) != c.GlobalBatchIds(step);
  }
  EXPECT_EQ(differing, 10);
  // A copy shares the same stream.
  const BatchSampler copy = a;
  EXPECT_EQ(copy.SampleIds(17, 1, 0), a.SampleIds(17, 1, 0));
}

TEST(BatchSamplerTest, SingleSampleDataset) {
  const BatchSampler s(1, 0, 1, 2, 3);
  EXPECT_EQ(s.GlobalBatchIds(4), std::vector<int64_t>(6, 0));
}

TEST(BatchSamplerTest, ThreadSafe) {
  // Small N so that the threads constantly cross epochs and evict cached permutations.
  constexpr int kReplicas = 2, kMicroBatches = 4, kMicroBatchSize = 3;
  constexpr int64_t kSteps = 300;
  const BatchSampler reference(37, 9, kReplicas, kMicroBatches, kMicroBatchSize);
  std::vector<std::vector<int64_t>> expected;
  for (int64_t step = 0; step < kSteps; ++step) expected.push_back(reference.GlobalBatchIds(step));

  const BatchSampler shared(37, 9, kReplicas, kMicroBatches, kMicroBatchSize);
  constexpr int kThreads = 8;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      const int r = th % kReplicas;
      const int i = (th / kReplicas) % kMicroBatches;
      // Threads walk the steps at different strides and directions.
      for (int64_t k = 0; k < kSteps; ++k) {
        const int64_t step = th % 2 == 0 ? k : kSteps - 1 - k;
        const std::vector<int64_t> ids = shared.SampleIds(step, r, i);
        const auto& g = expected[static_cast<size_t>(step)];
        const auto begin = g.begin() + (r * kMicroBatches + i) * kMicroBatchSize;
        if (!std::equal(ids.begin(), ids.end(), begin, begin + kMicroBatchSize)) {
          ++mismatches[static_cast<size_t>(th)];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int th = 0; th < kThreads; ++th) EXPECT_EQ(mismatches[static_cast<size_t>(th)], 0) << th;
}

}  // namespace
}  // namespace pipetrain::data
