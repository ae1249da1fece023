#include "runtime/weights/weight_store.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <map>
#include <set>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::weights {
namespace {

class SingleVersionWeights : public WeightStore {
 public:
  SingleVersionWeights(std::unique_ptr<model::StageModule> module,
                       std::unique_ptr<Optimizer> optimizer, int64_t start_version)
      : module_(std::move(module)), optimizer_(std::move(optimizer)), version_(start_version) {}

  absl::StatusOr<model::StageModule*> ModuleFor(int64_t) override { return module_.get(); }
  int64_t VersionFor(int64_t) const override { return version_; }
  absl::StatusOr<std::vector<at::Tensor>> Gradients(int64_t) override {
    module_->FoldSharedGradients();
    return DefinedGradients(module_->OwnParameters());
  }
  void FoldSharedGradients() override { module_->FoldSharedGradients(); }

  absl::Status Update(int64_t mini_batch) override {
    module_->FoldSharedGradients();
    std::vector<at::Tensor> params = module_->OwnParameters();
    std::vector<at::Tensor> grads = GradientsOf(params);
    last_skipped_ = !AllFinite(grads);
    if (!last_skipped_) {
      optimizer_->UseLearningRateOf(mini_batch);
      optimizer_->Step(params, grads);
      module_->FinishMiniBatch(mini_batch);
    } else {
      module_->DiscardMiniBatch(mini_batch);
    }
    module_->ZeroGrad();
    ++version_;
    return absl::OkStatus();
  }
  const model::StageModule& Newest() const override { return *module_; }
  model::StageModule& MutableNewest() override { return *module_; }
  int64_t newest_version() const override { return version_; }
  std::vector<ParameterState> OptimizerState() const override { return optimizer_->State(); }
  absl::Status LoadOptimizerState(const std::vector<ParameterState>& state) override {
    return optimizer_->LoadState(state);
  }

 private:
  std::unique_ptr<model::StageModule> module_;
  std::unique_ptr<Optimizer> optimizer_;
  int64_t version_;
};

class DoubleBufferedWeights : public WeightStore {
 public:
  DoubleBufferedWeights(std::unique_ptr<model::StageModule> module,
                        std::unique_ptr<Optimizer> optimizer, int micro_batches,
                        int64_t start_version, std::unique_ptr<model::StageModule> stale)
      : optimizer_(std::move(optimizer)), micro_batches_(micro_batches), newest_(start_version) {
    const int slot = static_cast<int>(start_version % 2);
    held_[slot] = start_version;
    if (stale != nullptr && start_version > 0) {
      buffers_[1 - slot] = std::move(stale);  // W(N-1): mini-batch N runs on it
      held_[1 - slot] = start_version - 1;
    } else {
      buffers_[1 - slot] = module->Clone();
      held_[1 - slot] = -1;
      if (start_version > 0) switches_.insert(start_version);
    }
    buffers_[slot] = std::move(module);
  }

  int64_t VersionFor(int64_t micro_batch) const override {
    return VersionForMiniBatch(micro_batch / micro_batches_);
  }

  absl::Status UseNewestFrom(int64_t mini_batch) override {
    if (!switches_.empty() && mini_batch <= *switches_.rbegin()) {
      return absl::InternalError(absl::StrCat("weight-version switch at mini-batch ", mini_batch,
                                              " after one at ", *switches_.rbegin(),
                                              ": switches must come in increasing order"));
    }
    switches_.insert(mini_batch);
    return absl::OkStatus();
  }

  absl::StatusOr<model::StageModule*> ModuleFor(int64_t micro_batch) override {
    return Holding(VersionFor(micro_batch), absl::StrCat("micro-batch ", micro_batch));
  }

  absl::StatusOr<std::vector<at::Tensor>> Gradients(int64_t t) override {
    PT_ASSIGN_OR_RETURN(model::StageModule * source,
                        Holding(VersionForMiniBatch(t), absl::StrCat("the gradient of ", t)));
    source->FoldSharedGradients();
    return DefinedGradients(source->OwnParameters());
  }
  void FoldSharedGradients() override {
    for (auto& buffer : buffers_) buffer->FoldSharedGradients();
  }

  // W(t+1) = W(t) - step(g_t), g_t accumulated on W(VersionForMiniBatch(t)).
  absl::Status Update(int64_t t) override {
    if (t != newest_) {
      return absl::InternalError(absl::StrCat("2BW update for mini-batch ", t,
                                              " but the newest version is ", newest_,
                                              ": updates must come once per mini-batch, in order"));
    }
    PT_ASSIGN_OR_RETURN(model::StageModule * grad_source,
                        Holding(VersionForMiniBatch(t), absl::StrCat("update ", t)));
    PT_ASSIGN_OR_RETURN(model::StageModule * base, Holding(t, absl::StrCat("update ", t)));
    grad_source->FoldSharedGradients();
    std::vector<at::Tensor> grads = GradientsOf(grad_source->OwnParameters());
    const int target_slot = static_cast<int>((t + 1) % 2);
    model::StageModule& target = *buffers_[target_slot];
    // For t >= 1 the target buffer is usually the gradient source: its gradients were read
    // above, and copying weights leaves gradient tensors alone. Right after a switch the
    // gradient source is `base`, and the target (W(t-1)) is no longer used by anyone.
    target.CopyWeightsFrom(*base);
    last_skipped_ = !AllFinite(grads);
    if (!last_skipped_) {
      optimizer_->UseLearningRateOf(t);
      optimizer_->Step(target.OwnParameters(), grads);
      target.FinishMiniBatch(t);
    } else {
      target.DiscardMiniBatch(t);  // W(t+1) = W(t)
    }
    grad_source->ZeroGrad();
    held_[target_slot] = t + 1;
    newest_ = t + 1;
    return absl::OkStatus();
  }

  const model::StageModule& Newest() const override { return *buffers_[newest_ % 2]; }
  model::StageModule& MutableNewest() override { return *buffers_[newest_ % 2]; }
  int64_t newest_version() const override { return newest_; }
  const model::StageModule* StaleForNext() const override {
    const int64_t v = VersionForMiniBatch(newest_);
    const int slot = static_cast<int>(v % 2);
    return v != newest_ && held_[slot] == v ? buffers_[slot].get() : nullptr;
  }
  std::vector<ParameterState> OptimizerState() const override { return optimizer_->State(); }
  absl::Status LoadOptimizerState(const std::vector<ParameterState>& state) override {
    return optimizer_->LoadState(state);
  }

 private:
  absl::StatusOr<model::StageModule*> Holding(int64_t version, const std::string& who) {
    const int slot = static_cast<int>(version % 2);
    if (held_[slot] != version) {
      return absl::InternalError(absl::StrCat(who, " needs weight version ", version,
                                              " but it is no longer held (buffers hold ", held_[0],
                                              " and ", held_[1], ")"));
    }
    return buffers_[slot].get();
  }

  // max(t-1, 0), or the latest switch at or before t if that is later.
  int64_t VersionForMiniBatch(int64_t t) const {
    const int64_t stale = schedule::TwoBWVersionForMicroBatch(t * micro_batches_, micro_batches_);
    auto after = switches_.upper_bound(t);
    return after == switches_.begin() ? stale : std::max(stale, *std::prev(after));
  }

  std::array<std::unique_ptr<model::StageModule>, 2> buffers_;
  std::array<int64_t, 2> held_;
  // Boundaries of weight-version switches: mini-batch t uses at least the latest one <= t.
  std::set<int64_t> switches_;
  std::unique_ptr<Optimizer> optimizer_;
  int micro_batches_;
  int64_t newest_;
};

class StashedWeights : public WeightStore {
 public:
  StashedWeights(std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
                 int micro_batches, int64_t start_version, bool versions_given)
      : optimizer_(std::move(optimizer)),
        micro_batches_(micro_batches),
        newest_(start_version),
        versions_given_(versions_given),
        latest_given_(start_version) {
    versions_[start_version] = std::move(module);
  }

  absl::Status RunOn(int64_t micro_batch, int64_t version) override {
    if (!versions_given_) return WeightStore::RunOn(micro_batch, version);
    if (auto it = assigned_.find(micro_batch); it != assigned_.end() && it->second != version) {
      return absl::InternalError(absl::StrCat("micro-batch ", micro_batch, " runs on version ",
                                              it->second, ", not ", version));
    }
    if (versions_.count(version) == 0) {
      return absl::InternalError(absl::StrCat("micro-batch ", micro_batch, " runs on version ",
                                              version, " but this stage holds ",
                                              versions_.begin()->first, " to ", newest_, " only"));
    }
    assigned_[micro_batch] = version;
    latest_given_ = std::max(latest_given_, version);
    return absl::OkStatus();
  }

  int64_t VersionFor(int64_t micro_batch) const override {
    auto it = assigned_.find(micro_batch);
    return it == assigned_.end() ? newest_ : it->second;
  }

  absl::StatusOr<model::StageModule*> ModuleFor(int64_t micro_batch) override {
    const int64_t version = assigned_.emplace(micro_batch, newest_).first->second;
    auto it = versions_.find(version);
    if (it == versions_.end()) {
      return absl::InternalError(absl::StrCat("micro-batch ", micro_batch, " ran on version ",
                                              version, ", which is no longer held"));
    }
    return it->second.get();
  }

  // The sum over the versions in version order, taken out of them (they hold mini-batch t's
  // gradients alone: its backwards are done and none of t + 1's has begun).
  absl::StatusOr<std::vector<at::Tensor>> Gradients(int64_t t) override {
    if (gradient_step_ == t) return gradient_;
    FoldSharedGradients();
    std::vector<at::Tensor> sum = DefinedGradients(versions_.at(newest_)->OwnParameters());
    for (auto& [version, module] : versions_) {
      if (version == newest_) continue;
      const std::vector<at::Tensor> params = module->OwnParameters();
      for (size_t k = 0; k < params.size(); ++k) {
        if (params[k].grad().defined()) sum[k].add_(params[k].grad());
      }
      module->ZeroGrad();
    }
    gradient_ = std::move(sum);
    gradient_step_ = t;
    return gradient_;
  }

  void FoldSharedGradients() override {
    for (auto& [version, module] : versions_) module->FoldSharedGradients();
  }

  // W(n+1) = W(n) − step(mini-batch t's gradient over the versions it ran on).
  absl::Status Update(int64_t t) override {
    PT_ASSIGN_OR_RETURN(std::vector<at::Tensor> grads, Gradients(t));
    // Micro-batches up to t's last have run their backward: they hold no version any more,
    // and the versions no other micro-batch runs on go (their gradients are in `grads`)
    // before the new one is made.
    assigned_.erase(assigned_.begin(), assigned_.lower_bound((t + 1) * micro_batches_));
    DropUnusedVersions();
    std::unique_ptr<model::StageModule>& newest = versions_.at(newest_);
    const bool in_use = std::any_of(assigned_.begin(), assigned_.end(),
                                    [this](const auto& a) { return a.second == newest_; }) ||
                        versions_given_;  // a later micro-batch may be given it
    std::unique_ptr<model::StageModule> next = in_use ? newest->Clone() : std::move(newest);
    last_skipped_ = !AllFinite(grads);
    if (!last_skipped_) {
      optimizer_->UseLearningRateOf(t);
      optimizer_->Step(next->OwnParameters(), grads);
      next->FinishMiniBatch(t);
    } else {
      next->DiscardMiniBatch(t);  // W(n+1) = W(n)
    }
    if (in_use) {
      newest->ZeroGrad();  // its gradient was summed into `grads`
    } else {
      versions_.erase(newest_);
    }
    next->ZeroGrad();
    versions_[++newest_] = std::move(next);
    gradient_.clear();
    gradient_step_ = -1;
    DropUnusedVersions();
    return absl::OkStatus();
  }

  const model::StageModule& Newest() const override { return *versions_.at(newest_); }
  model::StageModule& MutableNewest() override { return *versions_.at(newest_); }
  int held_versions() const override { return static_cast<int>(versions_.size()); }
  int64_t newest_version() const override { return newest_; }
  std::vector<ParameterState> OptimizerState() const override { return optimizer_->State(); }
  absl::Status LoadOptimizerState(const std::vector<ParameterState>& state) override {
    return optimizer_->LoadState(state);
  }

 private:
  // Versions no micro-batch runs on any more, but the newest (and, with versions given, those
  // from the latest given on: later micro-batches are given those or newer), go.
  void DropUnusedVersions() {
    for (auto it = versions_.begin(); it != versions_.end();) {
      const int64_t version = it->first;
      const bool used = version == newest_ || (versions_given_ && version >= latest_given_) ||
                        std::any_of(assigned_.begin(), assigned_.end(),
                                    [version](const auto& a) { return a.second == version; });
      it = used ? std::next(it) : versions_.erase(it);
    }
  }

  std::unique_ptr<Optimizer> optimizer_;
  int micro_batches_;
  int64_t newest_;
  bool versions_given_;   // vertical sync: RunOn() chooses each micro-batch's version
  int64_t latest_given_;  // the newest version RunOn() has given
  std::map<int64_t, std::unique_ptr<model::StageModule>> versions_;  // held ones, by number
  std::map<int64_t, int64_t> assigned_;  // micro-batch -> the version it runs on
  std::vector<at::Tensor> gradient_;     // Gradients(gradient_step_), until its update
  int64_t gradient_step_ = -1;
};

}  // namespace

namespace {

// Whether any of n IEEE values has its exponent all ones (an infinity or a NaN). The OR
// reduction over integers vectorizes; `Bits` is the unsigned type of the value's width.
template <typename Bits>
bool AnyNonFinite(const void* data, int64_t n, Bits exponent) {
  const Bits* bits = static_cast<const Bits*>(data);
  Bits any = 0;
  for (int64_t i = 0; i < n; ++i) any |= static_cast<Bits>((bits[i] & exponent) == exponent);
  return any != 0;
}

}  // namespace

bool AllFinite(const std::vector<at::Tensor>& tensors) {
  // A CPU float32/float64 tensor is read in place; any other goes through ATen, its answers
  // gathered into one (a single synchronization for device tensors).
  std::vector<at::Tensor> verdicts;
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == at::kFloat) {
      if (AnyNonFinite<uint32_t>(t.data_ptr(), t.numel(), 0x7f800000u)) return false;
    } else if (t.device().is_cpu() && t.is_contiguous() && t.scalar_type() == at::kDouble) {
      if (AnyNonFinite<uint64_t>(t.data_ptr(), t.numel(), 0x7ff0000000000000ull)) return false;
    } else {
      verdicts.push_back(at::isfinite(t).all());
    }
  }
  return verdicts.empty() || at::stack(verdicts).all().item<bool>();
}

std::vector<at::Tensor> DefinedGradients(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const at::Tensor& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    grads.push_back(p.grad());
  }
  return grads;
}

std::vector<at::Tensor> GradientsOf(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  for (const at::Tensor& p : params) {
    grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
  }
  return grads;
}

absl::StatusOr<std::unique_ptr<WeightStore>> MakeSingleVersionWeights(
    std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
    int64_t start_version) {
  if (start_version < 0) return absl::InvalidArgumentError("start_version must be >= 0");
  optimizer->UseParameterKinds(module->OwnParameterKinds());
  return std::unique_ptr<WeightStore>(
      new SingleVersionWeights(std::move(module), std::move(optimizer), start_version));
}

absl::StatusOr<std::unique_ptr<WeightStore>> MakeStashedWeights(
    std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
    int micro_batches, int64_t start_version, bool versions_given) {
  if (micro_batches < 1) return absl::InvalidArgumentError("micro_batches must be >= 1");
  if (start_version < 0) return absl::InvalidArgumentError("start_version must be >= 0");
  optimizer->UseParameterKinds(module->OwnParameterKinds());
  return std::unique_ptr<WeightStore>(new StashedWeights(
      std::move(module), std::move(optimizer), micro_batches, start_version, versions_given));
}

absl::StatusOr<std::unique_ptr<WeightStore>> MakeDoubleBufferedWeights(
    std::unique_ptr<model::StageModule> module, std::unique_ptr<Optimizer> optimizer,
    int micro_batches, int64_t start_version, std::unique_ptr<model::StageModule> stale) {
  if (micro_batches < 1) return absl::InvalidArgumentError("micro_batches must be >= 1");
  if (start_version < 0) return absl::InvalidArgumentError("start_version must be >= 0");
  optimizer->UseParameterKinds(module->OwnParameterKinds());
  return std::unique_ptr<WeightStore>(new DoubleBufferedWeights(
      std::move(module), std::move(optimizer), micro_batches, start_version, std::move(stale)));
}

}  // namespace pipetrain::weights
