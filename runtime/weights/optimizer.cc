#include "runtime/weights/optimizer.h"

#include <cmath>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/errors.h"

namespace pipetrain::weights {
namespace {

class Sgd : public Optimizer {
 public:
  explicit Sgd(OptimizerConfig c) : c_(std::move(c)) {}
  void Step(const std::vector<at::Tensor>& params,
            const std::vector<at::Tensor>& grads) override {
    at::NoGradGuard no_grad;
    if (momentum_.empty()) momentum_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      at::Tensor d_p = grads[i];
      if (c_.weight_decay != 0) d_p = d_p.add(params[i], c_.weight_decay);
      if (c_.momentum != 0) {
        if (!momentum_[i].defined()) {
          momentum_[i] = d_p.clone();
        } else {
          momentum_[i].mul_(c_.momentum).add_(d_p);
        }
        d_p = momentum_[i];
      }
      params[i].add_(d_p, -c_.lr);
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
  OptimizerConfig c_;
  std::vector<at::Tensor> momentum_;
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(OptimizerConfig c) : c_(std::move(c)) {}
  void Step(const std::vector<at::Tensor>& params,
            const std::vector<at::Tensor>& grads) override {
    at::NoGradGuard no_grad;
    if (state_.empty()) state_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!grads[i].defined()) continue;
      const at::Tensor& p = params[i];
      const at::Tensor& grad = grads[i];
      Moments& s = state_[i];
      p.mul_(1 - c_.lr * c_.weight_decay);
      if (!s.exp_avg.defined()) {
        s.exp_avg = at::zeros_like(p);
        s.exp_avg_sq = at::zeros_like(p);
      }
      s.step += 1;
      const double bias_correction1 = 1 - std::pow(c_.beta1, s.step);
      const double bias_correction2 = 1 - std::pow(c_.beta2, s.step);
      s.exp_avg.mul_(c_.beta1).add_(grad, 1 - c_.beta1);
      s.exp_avg_sq.mul_(c_.beta2).addcmul_(grad, grad, 1 - c_.beta2);
      at::Tensor denom = (s.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(c_.eps);
      p.addcdiv_(s.exp_avg, denom, -c_.lr / bias_correction1);
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
  OptimizerConfig c_;
  std::vector<Moments> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config) {
  if (absl::Status s = ValidateOptimizerConfig(config); !s.ok()) return s;
  if (config.name == "sgd") return std::unique_ptr<Optimizer>(new Sgd(config));
  return std::unique_ptr<Optimizer>(new AdamW(config));
}

}  // namespace pipetrain::weights
