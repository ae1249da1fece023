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
      State& s = state_[i];
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

 private:
  struct State {
    int64_t step = 0;
    at::Tensor exp_avg, exp_avg_sq;
  };
  OptimizerConfig c_;
  std::vector<State> state_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config) {
  if (absl::Status s = ValidateOptimizerConfig(config); !s.ok()) return s;
  if (config.name == "sgd") return std::unique_ptr<Optimizer>(new Sgd(config));
  return std::unique_ptr<Optimizer>(new AdamW(config));
}

}  // namespace pipetrain::weights
