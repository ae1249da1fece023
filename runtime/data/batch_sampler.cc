// BatchSampler: per-epoch Fisher-Yates permutations, concatenated into one sample stream
// that is cut into global batches and sharded replica-major, micro-batch-major.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/data/dataset.h"
#include "runtime/data/rng.h"

namespace pipetrain::data {

struct BatchSampler::EpochCache {
  // Enough for replicas that are a few steps apart around an epoch boundary.
  static constexpr size_t kCapacity = 4;

  std::mutex mu;
  std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> by_epoch;  // guarded by mu
};

namespace {

constexpr uint64_t kShuffleSalt = 0x73687566666C6500;  // "shuffle"

std::vector<int64_t> MakePermutation(int64_t num_samples, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(num_samples));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  internal::Rng rng(
      internal::HashPair(internal::HashPair(seed, kShuffleSalt), static_cast<uint64_t>(epoch)));
  for (int64_t i = num_samples - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

}  // namespace

BatchSampler::BatchSampler(int64_t num_samples, uint64_t seed, int replicas, int micro_batches,
                           int micro_batch_size)
    : num_samples_(num_samples),
      seed_(seed),
      replicas_(replicas),
      micro_batches_(micro_batches),
      micro_batch_size_(micro_batch_size),
      cache_(std::make_shared<EpochCache>()) {
  if (num_samples < 1 || replicas < 1 || micro_batches < 1 || micro_batch_size < 1) {
    internal::Fatal(absl::StrCat(
        "BatchSampler: num_samples (", num_samples, "), replicas (", replicas, "), micro_batches (",
        micro_batches, ") and micro_batch_size (", micro_batch_size, ") must all be >= 1"));
  }
}

int64_t BatchSampler::global_batch_size() const {
  return int64_t{replicas_} * micro_batches_ * micro_batch_size_;
}

std::shared_ptr<const std::vector<int64_t>> BatchSampler::EpochPermutation(int64_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->by_epoch.find(epoch);
    if (it != cache_->by_epoch.end()) return it->second;
  }
  // Computed outside the lock; if two threads race, both results are identical and the
  // first one inserted wins.
  auto perm =
      std::make_shared<const std::vector<int64_t>>(MakePermutation(num_samples_, seed_, epoch));
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto [it, inserted] = cache_->by_epoch.emplace(epoch, std::move(perm));
  if (inserted && cache_->by_epoch.size() > EpochCache::kCapacity) {
    // Evict the epoch farthest from the one just used (steps move forward, so usually the
    // oldest). Holders of an evicted permutation keep it alive through their shared_ptr.
    auto far = cache_->by_epoch.begin();
    auto last = std::prev(cache_->by_epoch.end());
    if (epoch - far->first < last->first - epoch) far = last;
    cache_->by_epoch.erase(far);
  }
  return it->second;
}

void BatchSampler::AppendStream(int64_t begin, int64_t count, std::vector<int64_t>* ids) const {
  ids->reserve(ids->size() + static_cast<size_t>(count));
  int64_t pos = begin;
  const int64_t end = begin + count;
  while (pos < end) {
    const int64_t epoch = pos / num_samples_;
    const int64_t offset = pos % num_samples_;
    const int64_t take = std::min(end - pos, num_samples_ - offset);
    const std::shared_ptr<const std::vector<int64_t>> perm = EpochPermutation(epoch);
    ids->insert(ids->end(), perm->begin() + offset, perm->begin() + offset + take);
    pos += take;
  }
}

std::vector<int64_t> BatchSampler::SampleIds(int64_t step, int replica, int micro_batch) const {
  if (step < 0 || replica < 0 || replica >= replicas_ || micro_batch < 0 ||
      micro_batch >= micro_batches_) {
    internal::Fatal(absl::StrCat("BatchSampler::SampleIds: step ", step, ", replica ", replica,
                                 " (of ", replicas_, "), micro_batch ", micro_batch, " (of ",
                                 micro_batches_, ") out of range"));
  }
  const int64_t b = micro_batch_size_;
  const int64_t begin =
      step * global_batch_size() + int64_t{replica} * micro_batches_ * b + int64_t{micro_batch} * b;
  std::vector<int64_t> ids;
  AppendStream(begin, b, &ids);
  return ids;
}

std::vector<int64_t> BatchSampler::GlobalBatchIds(int64_t step) const {
  if (step < 0) {
    internal::Fatal(absl::StrCat("BatchSampler::GlobalBatchIds: step ", step, " < 0"));
  }
  std::vector<int64_t> ids;
  AppendStream(step * global_batch_size(), global_batch_size(), &ids);
  return ids;
}

}  // namespace pipetrain::data
