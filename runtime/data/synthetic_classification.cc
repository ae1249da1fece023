// Synthetic classification: Gaussian inputs labelled by a fixed random linear teacher.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/data/dataset.h"
#include "runtime/data/rng.h"

namespace pipetrain::data {
namespace {

constexpr uint64_t kTeacherSalt = 0x7465616368657200;  // "teacher"
constexpr uint64_t kSampleSalt = 0x73616D706C650000;   // "sample"

class SyntheticClassification final : public Dataset {
 public:
  SyntheticClassification(const SyntheticClassificationOptions& opts, int64_t dim)
      : opts_(opts), dim_(dim) {
    // Teacher W: [num_classes, dim], entries N(0, 1) (the scale does not change the argmax).
    internal::Rng rng(internal::HashPair(opts_.seed, kTeacherSalt));
    teacher_.resize(static_cast<size_t>(opts_.num_classes * dim_));
    for (float& w : teacher_) w = static_cast<float>(rng.Normal());
    sample_seed_ = internal::HashPair(opts_.seed, kSampleSalt);
  }

  std::string Describe() const override {
    return absl::StrCat("synthetic classification (shape [",
                        absl::StrJoin(opts_.sample_shape, ", "), "], ", opts_.num_classes,
                        " classes, ", opts_.num_samples, " samples)");
  }
  int64_t num_samples() const override { return opts_.num_samples; }
  int64_t num_classes() const override { return opts_.num_classes; }
  std::vector<int64_t> sample_shape() const override { return opts_.sample_shape; }
  bool is_token_data() const override { return false; }

  MicroBatch Read(const std::vector<int64_t>& sample_ids) const override {
    const int64_t rows = static_cast<int64_t>(sample_ids.size());
    MicroBatch batch;
    batch.input_shape.reserve(opts_.sample_shape.size() + 1);
    batch.input_shape.push_back(rows);
    batch.input_shape.insert(batch.input_shape.end(), opts_.sample_shape.begin(),
                             opts_.sample_shape.end());
    batch.input_values.resize(static_cast<size_t>(rows * dim_));
    batch.target_shape = {rows};
    batch.targets.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = sample_ids[static_cast<size_t>(r)];
      if (id < 0 || id >= opts_.num_samples) {
        internal::Fatal(absl::StrCat("Read: sample id ", id, " out of range [0, ",
                                     opts_.num_samples, ") of ", Describe()));
      }
      float* x = batch.input_values.data() + r * dim_;
      internal::Rng rng(internal::HashPair(sample_seed_, static_cast<uint64_t>(id)));
      for (int64_t d = 0; d < dim_; ++d) x[d] = static_cast<float>(rng.Normal());
      batch.targets[static_cast<size_t>(r)] = Label(x);
    }
    return batch;
  }

 private:
  // argmax_k (W x)_k, ties to the lowest k; accumulated in double for a stable result.
  int64_t Label(const float* x) const {
    int64_t best = 0;
    double best_score = 0.0;
    for (int64_t k = 0; k < opts_.num_classes; ++k) {
      const float* w = teacher_.data() + k * dim_;
      double score = 0.0;
      for (int64_t d = 0; d < dim_; ++d) score += static_cast<double>(w[d]) * x[d];
      if (k == 0 || score > best_score) {
        best = k;
        best_score = score;
      }
    }
    return best;
  }

  const SyntheticClassificationOptions opts_;
  const int64_t dim_;
  std::vector<float> teacher_;
  uint64_t sample_seed_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> MakeSyntheticClassification(
    const SyntheticClassificationOptions& opts) {
  if (opts.sample_shape.empty()) {
    return absl::InvalidArgumentError("synthetic classification: sample_shape is empty");
  }
  int64_t dim = 1;
  for (int64_t extent : opts.sample_shape) {
    if (extent < 1) {
      return absl::InvalidArgumentError(absl::StrCat("synthetic classification: sample_shape [",
                                                     absl::StrJoin(opts.sample_shape, ", "),
                                                     "] has an extent < 1"));
    }
    dim *= extent;
  }
  if (opts.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic classification: num_classes must be >= 2, got ", opts.num_classes));
  }
  if (opts.num_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic classification: num_samples must be >= 1, got ", opts.num_samples));
  }
  return std::unique_ptr<Dataset>(std::make_unique<SyntheticClassification>(opts, dim));
}

}  // namespace pipetrain::data
