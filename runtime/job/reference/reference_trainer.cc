// The un-pipelined reference trainer. See reference_trainer.h.
#include "runtime/job/reference/reference_trainer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/job/plan.h"
#include "runtime/job/report/report.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {
namespace {

// torch.optim's SGD or AdamW over `params`, in two parameter groups as users write them for
// no_decay: those of a kind in o.no_decay (kinds[i], model::Layer::ParameterKindsOf) with
// weight_decay 0, the others with o.weight_decay.
std::unique_ptr<torch::optim::Optimizer> TorchOptimizer(
    const weights::OptimizerConfig& o, const std::vector<at::Tensor>& params,
    const std::vector<model::ParameterKinds>& kinds) {
  std::vector<at::Tensor> decayed, not_decayed;
  for (size_t i = 0; i < params.size(); ++i) {
    ((kinds.at(i) & o.no_decay) != 0 ? not_decayed : decayed).push_back(params[i]);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& [group, decay] : {std::pair{&decayed, o.weight_decay}, {&not_decayed, 0.0}}) {
    if (group->empty()) continue;
    if (o.name == "sgd") {
      groups.emplace_back(
          *group, std::make_unique<torch::optim::SGDOptions>(
                      torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(decay)));
    } else {
      groups.emplace_back(
          *group, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr)
                                                                   .betas({o.beta1, o.beta2})
                                                                   .eps(o.eps)
                                                                   .weight_decay(decay)));
    }
  }
  if (o.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(o.lr));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(o.lr));
}

// Every layer's parameters' kinds, in the order of their Parameters().
std::vector<model::ParameterKinds> KindsOf(const model::StageModule& module) {
  std::vector<model::ParameterKinds> kinds;
  for (const auto& layer : module.layers()) {
    for (model::ParameterKinds k : layer->ParameterKindsOf()) kinds.push_back(k);
  }
  return kinds;
}

// torch.nn.utils.clip_grad_norm_ over `groups` (kWholeModel: one group of every parameter;
// the negative control: each stage's alone). Appends the whole model's norm to `norms`.
void Clip(const JobSpec& c, const std::vector<std::vector<at::Tensor>>& groups,
          ReferenceClipping clipping, std::vector<double>* norms) {
  if (c.optimizer().clip_grad_norm() <= 0) return;
  std::vector<at::Tensor> all;
  for (const auto& group : groups) all.insert(all.end(), group.begin(), group.end());
  if (clipping == ReferenceClipping::kWholeModel) {
    const double norm = torch::nn::utils::clip_grad_norm_(all, c.optimizer().clip_grad_norm());
    if (norms) norms->push_back(norm);
    return;
  }
  double squares = 0;
  for (const auto& group : groups) {
    const double norm = torch::nn::utils::clip_grad_norm_(group, c.optimizer().clip_grad_norm());
    squares += norm * norm;
  }
  if (norms) norms->push_back(std::sqrt(squares));
}

// The evaluation at boundary n (config.eval) of the model `forward` runs (on its newest
// weights, in evaluation mode): each replica's evaluated micro-batches' mean loss and
// accuracy, averaged over the replicas.
EvalPoint EvaluateReference(
    const JobSpec& c, const std::vector<std::unique_ptr<MicroBatchReader>>& readers, int64_t n,
    const std::function<at::Tensor(const at::Tensor&, const model::LayerContext&)>& forward) {
  torch::NoGradGuard no_grad;
  EvalPoint point;
  point.step = n;
  for (const auto& reader : readers) {
    double loss = 0, correct = 0, count = 0;
    for (int k = 0; k < c.eval().batches(); ++k) {
      model::LayerContext ctx;
      ctx.seed = c.seed();
      const at::Tensor out = forward(reader->EvalInputs(k), ctx);
      const at::Tensor logits = out.reshape({-1, out.size(-1)});
      const at::Tensor targets = reader->EvalTargets(k).reshape({-1});
      loss += at::cross_entropy_loss(logits, targets).item<double>();
      correct += (logits.argmax(-1) == targets).sum().item<double>();
      count += static_cast<double>(targets.numel());
    }
    point.loss += loss / c.eval().batches() / c.replicas();
    point.accuracy += correct / count / c.replicas();
  }
  return point;
}

// Whether the job evaluates at boundary n.
bool EvaluatesAt(const JobSpec& c, int64_t n) {
  return c.eval().every() > 0 && n % c.eval().every() == 0;
}

// LambdaLR's factor for update t, written as a user hands it to torch.optim.lr_scheduler.
// LambdaLR (docs/design.md section 4.8): linear warm-up, then constant, linear or cosine
// decay to min_lr over decay_steps (0: the steps after the warm-up).
double LambdaLrFactor(const JobSpec& c, int64_t t) {
  const weights::LearningRateSchedule& s = OptimizerConfigOf(c).schedule;
  if (t < s.warmup_steps) return (t + 1.0) / s.warmup_steps;
  if (s.decay == weights::LrDecay::kConstant) return 1.0;
  const double length = s.decay_steps > 0 ? s.decay_steps : c.steps() - s.warmup_steps;
  const double done = length > 0 ? std::min(1.0, (t - s.warmup_steps) / length) : 1.0;
  const double low = c.optimizer().lr() > 0 ? s.min_lr / c.optimizer().lr() : 0.0;
  const double shape =
      s.decay == weights::LrDecay::kLinear ? 1.0 - done : (1.0 + std::cos(M_PI * done)) / 2;
  return low + (1.0 - low) * shape;
}

// LambdaLR's step: every group of `optimizer` at the base rate times update t's factor.
void SetLearningRate(torch::optim::Optimizer& optimizer, const JobSpec& c, int64_t t) {
  for (torch::optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    group.options().set_lr(c.optimizer().lr() * LambdaLrFactor(c, t));
  }
}

// PipeDream's weight stashing (docs/design.md section 4.3a), without a schedule: stage s keeps its
// weight versions W_s(0), W_s(1), ... (W_s(t+1): W_s(t) stepped with mini-batch t's
// gradient). Micro-batch j runs through stage s, forward and backward alike, on version
// v_s(j) = max(0, floor((j − w_s) / m)), w_s = min(p − s − 1, steps·m): the updates stage s
// has made before its forward of j under 1F1B with w_s warm-up forwards. Mini-batch t's
// gradient on stage s is the sum over its micro-batches (every replica's) of the gradient at
// the versions they ran on, whichever those were. A tied parameter is one parameter, the
// group's first member: its gradient is the sum of every member's (each use on the version
// its own stage ran), its optimizer the first member's stage's, and its new value is copied
// to the other members (aliases that no optimizer steps) before their stages' next version.
// Under vertical sync every stage runs micro-batch j on stage 0's version v_0(j) instead
// (PipeDream's paper, section 3.3); the updates still step each stage's newest version.
// A boundary N in `drains` (a weight-version switch, flush or checkpoint: each drains the
// pipeline) restarts the rule there: every stage has made N updates when step N's first
// forward runs, so v_s(j) = N + max(0, floor((j − N·m − w_s) / m)) from step N on.
absl::StatusOr<std::vector<at::Tensor>> TrainPipeDream(
    const JobSpec& c, const JobPlan& plan,
    const std::vector<std::unique_ptr<MicroBatchReader>>& readers,
    const std::vector<int64_t>& drains, ReferenceClipping clipping, std::vector<double>* grad_norms,
    std::vector<EvalPoint>* evals) {
  PT_ASSIGN_OR_RETURN(model::LayerList layers, model::BuildModel(plan.model_config));
  const int p = plan.stages();
  const int64_t m = c.microbatches();
  struct Stage {
    std::unique_ptr<model::StageModule> live;  // the newest version, which the optimizer steps
    std::map<int64_t, std::unique_ptr<model::StageModule>> versions;  // copies, by number
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::vector<at::Tensor> trained;  // what the optimizer steps
    int64_t warmup = 0;
  };
  std::vector<Stage> stages(p);
  for (int s = 0; s < p; ++s) {
    const model::LayerRange r = plan.partition[s];
    stages[s].live =
        std::make_unique<model::StageModule>(r.begin, model::CloneLayers(layers, r.begin, r.end));
    stages[s].versions[0] = stages[s].live->Clone();
    stages[s].warmup = std::min<int64_t>(p - s - 1, int64_t{c.steps()} * m);
  }
  // Each tie group's members as live parameters, the canonical first.
  const auto live_parameter = [&](const model::ParameterRef& ref) {
    for (Stage& stage : stages) {
      const model::StageModule& module = *stage.live;
      const int local = ref.layer - module.first_layer();
      if (local < 0 || local >= module.num_layers()) continue;
      return module.layers()[local]->Parameters().at(static_cast<size_t>(ref.parameter));
    }
    return at::Tensor();
  };
  std::vector<std::vector<at::Tensor>> ties;
  for (const model::TieGroup& group : plan.ties) {
    std::vector<at::Tensor>& members = ties.emplace_back();
    for (const model::ParameterRef& ref : group) members.push_back(live_parameter(ref));
  }
  const auto is_alias = [&](const at::Tensor& param) {
    for (const std::vector<at::Tensor>& members : ties) {
      for (size_t k = 1; k < members.size(); ++k) {
        if (members[k].is_same(param)) return true;
      }
    }
    return false;
  };
  for (Stage& stage : stages) {
    std::vector<model::ParameterKinds> kinds;
    const std::vector<at::Tensor> params = stage.live->Parameters();
    const std::vector<model::ParameterKinds> all_kinds = KindsOf(*stage.live);
    for (size_t k = 0; k < params.size(); ++k) {
      if (is_alias(params[k])) continue;
      stage.trained.push_back(params[k]);
      kinds.push_back(all_kinds.at(k));
    }
    stage.optimizer = TorchOptimizer(OptimizerConfigOf(c), stage.trained, kinds);
  }
  // Vertical sync: every stage runs j on stage 0's version.
  const auto version = [&](const Stage& stage, int64_t j) {
    const int64_t warmup = c.vertical_sync() ? stages[0].warmup : stage.warmup;
    int64_t drained = 0;  // the latest drain at or before j's step
    for (int64_t n : drains) {
      if (n <= j / m) drained = std::max(drained, n);
    }
    const int64_t k = j - drained * m;  // j's place since then
    return drained + (k < warmup ? int64_t{0} : (k - warmup) / m);
  };
  try {
    for (int64_t t = 0; t < c.steps(); ++t) {
      for (size_t r = 0; r < readers.size(); ++r) {
        const auto& reader = readers[r];
        for (int i = 0; i < c.microbatches(); ++i) {
          const int64_t j = t * m + i;
          model::LayerContext ctx;
          ctx.micro_batch = (t * c.replicas() + static_cast<int64_t>(r)) * m + i;  // its place
          ctx.mini_batch = t;
          ctx.seed = c.seed();
          at::Tensor x = reader->Inputs(j);
          for (Stage& stage : stages) x = stage.versions.at(version(stage, j))->Forward(x, ctx);
          at::Tensor loss =
              at::cross_entropy_loss(x.reshape({-1, x.size(-1)}), reader->Targets(j).reshape({-1}));
          (loss * (1.0 / (c.microbatches() * c.replicas()))).backward();
        }
      }
      for (Stage& stage : stages) {
        std::vector<at::Tensor> live = stage.live->Parameters();
        for (auto& [v, module] : stage.versions) {
          const std::vector<at::Tensor> used = module->Parameters();
          for (size_t k = 0; k < live.size(); ++k) {
            if (!used[k].grad().defined()) continue;
            at::Tensor& grad = live[k].mutable_grad();
            grad = grad.defined() ? grad + used[k].grad() : used[k].grad().clone();
          }
          module->ZeroGrad();
        }
      }
      for (const std::vector<at::Tensor>& members : ties) {
        at::Tensor& grad = members[0].mutable_grad();
        for (size_t k = 1; k < members.size(); ++k) {
          if (!members[k].grad().defined()) continue;
          grad = grad.defined() ? grad + members[k].grad() : members[k].grad().clone();
          members[k].mutable_grad() = at::Tensor();
        }
      }
      {
        std::vector<std::vector<at::Tensor>> groups;
        for (const Stage& stage : stages) groups.push_back(stage.trained);
        Clip(c, groups, clipping, grad_norms);
      }
      for (Stage& stage : stages) {
        SetLearningRate(*stage.optimizer, c, t);
        stage.optimizer->step();
      }
      {
        torch::NoGradGuard no_grad;
        for (const std::vector<at::Tensor>& members : ties) {
          for (size_t k = 1; k < members.size(); ++k) members[k].copy_(members[0]);
        }
      }
      for (Stage& stage : stages) {
        stage.optimizer->zero_grad();
        stage.live->FinishMiniBatch(t);
        stage.versions[t + 1] = stage.live->Clone();
        // Versions before the one the next mini-batch's first micro-batch runs on are done.
        const int64_t oldest = version(stage, (t + 1) * m);
        stage.versions.erase(stage.versions.begin(), stage.versions.lower_bound(oldest));
      }
      if (evals != nullptr && EvaluatesAt(c, t + 1)) {
        for (Stage& stage : stages) stage.live->SetTraining(false);
        evals->push_back(EvaluateReference(
            c, readers, t + 1, [&](const at::Tensor& input, const model::LayerContext& ctx) {
              at::Tensor x = input;
              for (Stage& stage : stages) x = stage.live->Forward(x, ctx);
              return x;
            }));
        for (Stage& stage : stages) stage.live->SetTraining(true);
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reference run: ", e.what()));
  }
  std::vector<at::Tensor> params;
  for (const Stage& stage : stages) {
    for (const at::Tensor& t : DetachedCopies(stage.live->Parameters())) params.push_back(t);
  }
  return params;
}

}  // namespace

absl::StatusOr<std::vector<at::Tensor>> TrainReference(const JobSpec& c,
                                                       const std::vector<int64_t>& switch_at,
                                                       ReferenceClipping clipping,
                                                       std::vector<double>* grad_norms,
                                                       std::vector<EvalPoint>* evals) {
  PT_ASSIGN_OR_RETURN(JobPlan plan, MakeJobPlan(c));
  SetIntraOpThreads(AvailableCores());
  std::vector<std::unique_ptr<MicroBatchReader>> readers;
  for (int r = 0; r < c.replicas(); ++r) {
    readers.push_back(std::make_unique<MicroBatchReader>(plan, c.microbatches(), r));
  }
  if (schedule::WeightsOf(ScheduleOf(c)) == schedule::WeightPolicy::kStashed) {
    return TrainPipeDream(c, plan, readers, switch_at, clipping, grad_norms, evals);
  }
  PT_ASSIGN_OR_RETURN(model::LayerList layers, model::BuildModel(plan.model_config));
  model::StageModule current(0, std::move(layers));
  std::unique_ptr<model::StageModule> previous;  // W(t-1), 2BW only
  const bool two_bw = schedule::WeightsOf(ScheduleOf(c)) == schedule::WeightPolicy::kDoubleBuffered;
  if (two_bw) previous = current.Clone();
  model::StageModule& grad_module = two_bw ? *previous : current;

  std::vector<at::Tensor> params = current.Parameters();
  // Tied weights: one parameter, the group's first member. The others are aliases of it: their
  // gradients are added to its gradient, and its new value is copied to them.
  std::vector<std::vector<size_t>> ties;  // positions in `params`, canonical first
  {
    std::vector<size_t> first_of_layer;  // the position of each layer's first parameter
    size_t next = 0;
    for (const auto& layer : current.layers()) {
      first_of_layer.push_back(next);
      next += layer->Parameters().size();
    }
    for (const model::TieGroup& group : plan.ties) {
      std::vector<size_t> positions;
      for (const model::ParameterRef& ref : group) {
        positions.push_back(first_of_layer.at(ref.layer) + static_cast<size_t>(ref.parameter));
      }
      ties.push_back(std::move(positions));
    }
  }
  std::vector<at::Tensor> trained;  // what the optimizer steps: all but the aliases
  std::vector<model::ParameterKinds> trained_kinds;
  // The trained parameters of each model stage (the negative control clips them alone).
  std::vector<std::vector<at::Tensor>> stage_params(plan.partition.size());
  {
    const std::vector<model::ParameterKinds> kinds = KindsOf(current);
    size_t k = 0;
    for (int layer = 0; layer < current.num_layers(); ++layer) {
      size_t stage = 0;
      while (stage + 1 < plan.partition.size() && layer >= plan.partition[stage].end) ++stage;
      for (size_t n = current.layers()[layer]->Parameters().size(); n > 0; --n, ++k) {
        const bool alias =
            std::any_of(ties.begin(), ties.end(), [k](const std::vector<size_t>& tie) {
              return std::find(tie.begin() + 1, tie.end(), k) != tie.end();
            });
        if (alias) continue;
        trained.push_back(params[k]);
        trained_kinds.push_back(kinds.at(k));
        stage_params[stage].push_back(params[k]);
      }
    }
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      TorchOptimizer(OptimizerConfigOf(c), trained, trained_kinds);
  try {
    for (int64_t t = 0; t < c.steps(); ++t) {
      if (two_bw && std::count(switch_at.begin(), switch_at.end(), t) > 0) {
        previous->CopyWeightsFrom(current);  // mini-batch t runs on W(t), not W(t-1)
      }
      // The whole global batch: every replica's shard, micro-batch by micro-batch.
      for (size_t r = 0; r < readers.size(); ++r) {
        const auto& reader = readers[r];
        for (int i = 0; i < c.microbatches(); ++i) {
          const int64_t j = t * c.microbatches() + i;
          model::LayerContext ctx;
          // Its place in the job's sequence of micro-batches (model::LayerContext).
          ctx.micro_batch = (t * c.replicas() + static_cast<int64_t>(r)) * c.microbatches() + i;
          ctx.mini_batch = t;
          ctx.seed = c.seed();
          at::Tensor logits = grad_module.Forward(reader->Inputs(j), ctx);
          at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                   reader->Targets(j).reshape({-1}));
          (loss * (1.0 / (c.microbatches() * c.replicas()))).backward();
        }
      }
      if (two_bw) {
        // grad f(W(t-1)) is on `previous`; W(t-1) is then replaced by W(t).
        std::vector<at::Tensor> grads = weights::GradientsOf(previous->Parameters());
        previous->CopyWeightsFrom(current);
        for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[k].clone();
        previous->ZeroGrad();
      }
      for (const std::vector<size_t>& tie : ties) {
        at::Tensor& grad = params[tie[0]].mutable_grad();
        for (size_t k = 1; k < tie.size(); ++k) {
          if (!params[tie[k]].grad().defined()) continue;
          grad = grad.defined() ? grad + params[tie[k]].grad() : params[tie[k]].grad().clone();
          params[tie[k]].mutable_grad() = at::Tensor();
        }
      }
      Clip(c, stage_params, clipping, grad_norms);
      SetLearningRate(*optimizer, c, t);
      optimizer->step();
      optimizer->zero_grad();
      {
        torch::NoGradGuard no_grad;
        for (const std::vector<size_t>& tie : ties) {
          for (size_t k = 1; k < tie.size(); ++k) params[tie[k]].copy_(params[tie[0]]);
        }
      }
      current.FinishMiniBatch(t);
      if (evals != nullptr && EvaluatesAt(c, t + 1)) {
        current.SetTraining(false);
        evals->push_back(EvaluateReference(
            c, readers, t + 1, [&](const at::Tensor& input, const model::LayerContext& ctx) {
              return current.Forward(input, ctx);
            }));
        current.SetTraining(true);
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reference run: ", e.what()));
  }
  return DetachedCopies(current.Parameters());
}

double MaxRelativeDifference(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    at::Tensor x = a[i].to(at::kDouble), y = b[i].to(at::kDouble);
    const double diff = (x - y).norm().item<double>();
    const double ref = y.norm().item<double>();
    worst = std::max(worst, ref > 0 ? diff / ref : diff);
  }
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  return worst;
}

}  // namespace pipetrain::job
