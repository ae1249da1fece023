// Training data, free of LibTorch: datasets of fixed-shape samples and a deterministic
// sampler that shuffles them and shards each global batch among data-parallel replicas.
//
// A sample is one row: for token data a window of T+1 tokens gives T inputs and the T
// next-token targets; for feature data a vector/image of floats and one class label.
// Datasets are immutable after construction and thread-safe for concurrent Read().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::data {

// Rows of samples, laid out row-major.
struct MicroBatch {
  // Inputs: exactly one of tokens/values is non-empty.
  std::vector<int64_t> input_shape;  // [rows, T] for tokens; [rows, ...sample_shape] for values
  std::vector<int64_t> input_tokens;
  std::vector<float> input_values;
  // Targets: class ids; shape [rows, T] for tokens, [rows] for feature data.
  std::vector<int64_t> target_shape;
  std::vector<int64_t> targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // One line for logs: "synthetic markov corpus (vocab 64, 1048576 tokens, seq 32)".
  virtual std::string Describe() const = 0;
  virtual int64_t num_samples() const = 0;
  // Vocabulary size (token data) or number of classes (feature data).
  virtual int64_t num_classes() const = 0;
  // Per-sample input shape without the batch dimension: {T} or {C, H, W} or {D}.
  virtual std::vector<int64_t> sample_shape() const = 0;
  virtual bool is_token_data() const = 0;
  // The lowest achievable mean cross-entropy per target in nats, when known.
  virtual std::optional<double> entropy_nats() const { return std::nullopt; }
  // Rows sample_ids[0], sample_ids[1], ... Each id in [0, num_samples()).
  virtual MicroBatch Read(const std::vector<int64_t>& sample_ids) const = 0;
};

// Token data: non-overlapping windows of seq_len+1 tokens with stride seq_len.
struct TokenDataOptions {
  int64_t seq_len = 32;  // T
};

// A synthetic corpus from a first-order Markov chain over `vocab` tokens. Each token has
// `branching` possible successors with fixed, seed-determined probabilities, so the true
// entropy rate H(X_{n+1} | X_n) = sum_s pi(s) H(P(.|s)) is known exactly (pi: the stationary
// distribution, computed numerically) and is what entropy_nats() returns.
struct SyntheticCorpusOptions {
  int64_t vocab = 64;
  int64_t branching = 4;
  int64_t num_tokens = 1 << 20;
  uint64_t seed = 1234;
  TokenDataOptions window;
};
absl::StatusOr<std::unique_ptr<Dataset>> MakeSyntheticCorpus(const SyntheticCorpusOptions& opts);

// The largest token file read (it is read whole, opened without blocking and checked to be
// a regular file: runtime/base/regular_file.h). Over it: FailedPrecondition naming the file
// and the bound.
inline constexpr int64_t kMaxTokenFileBytes = int64_t{16} << 30;

// Any file read as bytes: vocabulary 256. NotFound / InvalidArgument (too short for one
// window) / FailedPrecondition (not a regular file, over kMaxTokenFileBytes) /
// ResourceExhausted (no memory for it), with the path in the message.
absl::StatusOr<std::unique_ptr<Dataset>> OpenByteFile(const std::string& path,
                                                      const TokenDataOptions& opts);

// A flat file of little-endian uint16 token ids. vocab = max id + 1 unless `vocab` > 0, in
// which case any id >= vocab is InvalidArgument (naming its offset). Odd file length is
// InvalidArgument.
absl::StatusOr<std::unique_ptr<Dataset>> OpenUint16TokenFile(const std::string& path,
                                                             const TokenDataOptions& opts,
                                                             int64_t vocab = 0);

// Synthetic classification: x ~ N(0, 1) of `sample_shape`, label = argmax(W x) for a fixed
// random teacher W, both determined by (seed, sample index): the same sample id always gives
// the same row.
struct SyntheticClassificationOptions {
  std::vector<int64_t> sample_shape = {32};  // {D} for an MLP, {C, H, W} for a CNN
  int64_t num_classes = 10;
  int64_t num_samples = 1 << 16;
  uint64_t seed = 1234;
};
absl::StatusOr<std::unique_ptr<Dataset>> MakeSyntheticClassification(
    const SyntheticClassificationOptions& opts);

// Deterministic shuffling and sharding.
//
// The sample stream is the concatenation of per-epoch permutations of [0, num_samples),
// each permutation a function of (seed, epoch) only. Step t's global batch is stream
// positions [t*B, (t+1)*B) with B = replicas * micro_batches * micro_batch_size. Replica r
// owns rows [r*m*b, (r+1)*m*b) of it, and its micro-batch i is rows [i*b, (i+1)*b) of that
// shard. So the union over replicas and micro-batches of step t is exactly the global
// batch, whatever w and m are. Thread-safe.
class BatchSampler {
 public:
  BatchSampler(int64_t num_samples, uint64_t seed, int replicas, int micro_batches,
               int micro_batch_size);

  int64_t global_batch_size() const;
  // Sample ids of micro-batch i (0 <= i < m) of replica r at step t.
  std::vector<int64_t> SampleIds(int64_t step, int replica, int micro_batch) const;
  // All ids of step t's global batch, in replica-major, micro-batch-major order.
  std::vector<int64_t> GlobalBatchIds(int64_t step) const;

 private:
  // Recently used epoch permutations, shared by copies of this sampler (they are a function
  // of (num_samples, seed, epoch) only) and guarded by a mutex inside.
  struct EpochCache;
  // The permutation of [0, num_samples) for `epoch`, computed once and cached.
  std::shared_ptr<const std::vector<int64_t>> EpochPermutation(int64_t epoch) const;
  // Appends the ids at stream positions [begin, begin + count) to *ids.
  void AppendStream(int64_t begin, int64_t count, std::vector<int64_t>* ids) const;

  int64_t num_samples_;
  uint64_t seed_;
  int replicas_;
  int micro_batches_;
  int micro_batch_size_;
  std::shared_ptr<EpochCache> cache_;
};

}  // namespace pipetrain::data
