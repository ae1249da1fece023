#include "runtime/weights/optimizer.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/errors.h"

namespace pipetrain::weights {
namespace {

class Sgd : public Optimizer {
 public:
  Sgd(OptimizerConfig c, int64_t job_steps) : Optimizer(std::move(c), job_steps) {}
  void Step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) override {
    at::NoGradGuard no_grad;
    if (momentum_.empty()) momentum_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor d_p = grads[i];
      if (const double decay = WeightDecayOf(i); decay != 0) d_p = d_p.add(params[i], decay);
      if (c_.momentum != 0) {
        if (!momentum_[i].defined()) {
          momentum_[i] = d_p.clone();
        } else {
          momentum_[i].mul_(c_.momentum).add_(d_p);
        }
        d_p = momentum_[i];
      }
      params[i].add_(d_p, -lr_);
    }
  }

  std::vector<ParameterState> State() const override {
    std::vector<ParameterState> out(momentum_.size());
    for (size_t i = 0; i < momentum_.size(); ++i) {
      if (momentum_[i].defined()) out[i]["momentum_buffer"] = momentum_[i].clone();
    }
    return out;
  }

  absl::Status LoadState(const std::vector<ParameterState>& state) override {
    std::vector<at::Tensor> momentum(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      for (const auto& [name, tensor] : state[i]) {
        if (name != "momentum_buffer") {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter ", i, ": sgd keeps no state named '", name, "'"));
        }
        momentum[i] = tensor.clone();
      }
    }
    momentum_ = std::move(momentum);
    return absl::OkStatus();
  }

 private:
  const OptimizerConfig& c_ = config_;
  std::vector<at::Tensor> momentum_;
};

class AdamW : public Optimizer {
 public:
  AdamW(OptimizerConfig c, int64_t job_steps) : Optimizer(std::move(c), job_steps) {}
  void Step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) override {
    at::NoGradGuard no_grad;
    if (state_.empty()) state_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor& p = params[i];
      const at::Tensor& grad = grads[i];
      Moments& s = state_[i];
      if (!s.exp_avg.defined()) {
        s.exp_avg = at::zeros_like(p);
        s.exp_avg_sq = at::zeros_like(p);
      }
      s.step += 1;
      const Coefficients k = CoefficientsAt(s.step, WeightDecayOf(i));
      if (FusesUpdate(p, grad, s)) {
        if (p.scalar_type() == at::kFloat) {
          FusedUpdate<float>(p, grad, s, k);
        } else {
          FusedUpdate<double>(p, grad, s, k);
        }
        continue;
      }
      p.mul_(k.decay);
      s.exp_avg.mul_(c_.beta1).add_(grad, 1 - c_.beta1);
      s.exp_avg_sq.mul_(c_.beta2).addcmul_(grad, grad, 1 - c_.beta2);
      at::Tensor denom = (s.exp_avg_sq.sqrt() / k.sqrt_bias_correction2).add_(c_.eps);
      p.addcdiv_(s.exp_avg, denom, k.step_size);
    }
  }

  std::vector<ParameterState> State() const override {
    std::vector<ParameterState> out(state_.size());
    for (size_t i = 0; i < state_.size(); ++i) {
      if (!state_[i].exp_avg.defined()) continue;
      out[i]["step"] = at::scalar_tensor(state_[i].step, at::kLong);
      out[i]["exp_avg"] = state_[i].exp_avg.clone();
      out[i]["exp_avg_sq"] = state_[i].exp_avg_sq.clone();
    }
    return out;
  }

  absl::Status LoadState(const std::vector<ParameterState>& state) override {
    std::vector<Moments> loaded(state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      if (state[i].empty()) continue;
      for (const auto& [name, tensor] : state[i]) {
        if (name != "step" && name != "exp_avg" && name != "exp_avg_sq") {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter ", i, ": adamw keeps no state named '", name, "'"));
        }
      }
      for (const char* name : {"step", "exp_avg", "exp_avg_sq"}) {
        if (!state[i].count(name)) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter ", i, ": adamw state without '", name, "'"));
        }
      }
      const at::Tensor& step = state[i].at("step");
      if (step.numel() != 1 || step.item<double>() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", i, ": adamw 'step' must be one number >= 1"));
      }
      loaded[i].step = static_cast<int64_t>(step.item<double>());
      loaded[i].exp_avg = state[i].at("exp_avg").clone();
      loaded[i].exp_avg_sq = state[i].at("exp_avg_sq").clone();
    }
    state_ = std::move(loaded);
    return absl::OkStatus();
  }

 private:
  struct Moments {
    int64_t step = 0;
    at::Tensor exp_avg, exp_avg_sq;
  };
  // The scalars of one parameter's update at its step-th update.
  struct Coefficients {
    double decay;  // 1 - lr * weight_decay (this update's lr, the parameter's decay)
    double sqrt_bias_correction2;  // sqrt(1 - beta2^step)
    double step_size;              // -lr / (1 - beta1^step)
  };
  Coefficients CoefficientsAt(int64_t step, double weight_decay) const {
    return {1 - lr_ * weight_decay, std::sqrt(1 - std::pow(c_.beta2, step)),
            -lr_ / (1 - std::pow(c_.beta1, step))};
  }

  // One pass over dense CPU tensors of one dtype instead of the seven operators below, each
  // a pass of its own with two temporaries: the same arithmetic in the same order per element.
  static bool FusesUpdate(const at::Tensor& p, const at::Tensor& grad, const Moments& s) {
    const at::ScalarType type = p.scalar_type();
    if (type != at::kFloat && type != at::kDouble) return false;
    for (const at::Tensor* t : {&p, &grad, &s.exp_avg, &s.exp_avg_sq}) {
      if (!t->device().is_cpu() || t->scalar_type() != type || !t->is_contiguous() ||
          t->numel() != p.numel()) {
        return false;
      }
    }
    return true;
  }

  template <typename T>
  void FusedUpdate(const at::Tensor& p, const at::Tensor& grad, Moments& s,
                   const Coefficients& k) const {
    T* param = p.data_ptr<T>();
    const T* g = grad.data_ptr<T>();
    T* m = s.exp_avg.data_ptr<T>();
    T* v = s.exp_avg_sq.data_ptr<T>();
    const T decay = static_cast<T>(k.decay), beta1 = static_cast<T>(c_.beta1),
            beta2 = static_cast<T>(c_.beta2), one_minus_beta1 = static_cast<T>(1 - c_.beta1),
            one_minus_beta2 = static_cast<T>(1 - c_.beta2),
            sqrt_bc2 = static_cast<T>(k.sqrt_bias_correction2), eps = static_cast<T>(c_.eps),
            step_size = static_cast<T>(k.step_size);
    at::parallel_for(0, p.numel(), int64_t{1} << 15, [&](int64_t begin, int64_t end) {
      // Four distinct tensors: no aliasing, so the loop vectorizes.
      T* __restrict param_r = param;
      const T* __restrict g_r = g;
      T* __restrict m_r = m;
      T* __restrict v_r = v;
      for (int64_t i = begin; i < end; ++i) {
        param_r[i] *= decay;
        m_r[i] = m_r[i] * beta1 + one_minus_beta1 * g_r[i];
        v_r[i] = v_r[i] * beta2 + one_minus_beta2 * g_r[i] * g_r[i];
        const T denom = std::sqrt(v_r[i]) / sqrt_bc2 + eps;
        param_r[i] += step_size * (m_r[i] / denom);
      }
    });
    // As an in-place operator would: autograd then refuses a backward through a graph that
    // saved the old values.
    p.unsafeGetTensorImpl()->bump_version();
  }

  const OptimizerConfig& c_ = config_;
  std::vector<Moments> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         int64_t job_steps) {
  if (absl::Status s = ValidateOptimizerConfig(config); !s.ok()) return s;
  if (config.name == "sgd") return std::unique_ptr<Optimizer>(new Sgd(config, job_steps));
  return std::unique_ptr<Optimizer>(new AdamW(config, job_steps));
}

}  // namespace pipetrain::weights
