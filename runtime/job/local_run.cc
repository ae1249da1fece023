#include "runtime/job/local_run.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/data/dataset.h"
#include "runtime/model/stage_module.h"
#include "runtime/schedule/simulator.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {
namespace {

using schedule::ActionKind;

absl::StatusOr<std::unique_ptr<data::Dataset>> MakeDataset(const JobConfig& c) {
  const std::string kind = EffectiveDataKind(c);
  data::TokenDataOptions window{c.data.seq_len};
  if (kind == "synthetic") {
    data::SyntheticCorpusOptions o;
    o.vocab = c.data.vocab;
    o.branching = c.data.branching;
    o.num_tokens = c.data.num_tokens;
    o.seed = c.data.seed;
    o.window = window;
    return data::MakeSyntheticCorpus(o);
  }
  if (kind == "bytes") return data::OpenByteFile(c.data.path, window);
  if (kind == "uint16") return data::OpenUint16TokenFile(c.data.path, window, c.data.vocab);
  data::SyntheticClassificationOptions o;
  o.sample_shape = c.model.name == "cnn" ? c.model.image_shape
                                         : std::vector<int64_t>{c.model.input_dim};
  o.num_classes = c.model.num_classes;
  o.num_samples = c.data.num_samples;
  o.seed = c.data.seed;
  return data::MakeSyntheticClassification(o);
}

// Everything a run needs that does not depend on the stage: data, model, partition.
struct Plan {
  std::unique_ptr<data::Dataset> dataset;
  std::unique_ptr<data::BatchSampler> sampler;
  model::ModelConfig model_config;
  model::LayerList layers;
  std::vector<model::LayerRange> partition;
  std::vector<bool> recompute;  // per global layer
  at::ScalarType dtype = at::kFloat;
};

absl::StatusOr<Plan> MakePlan(const JobConfig& c) {
  PT_RETURN_IF_ERROR(ValidateJobConfig(c));
  Plan plan;
  PT_ASSIGN_OR_RETURN(plan.dataset, MakeDataset(c));
  plan.model_config = c.model;
  plan.model_config.seed = c.seed;
  plan.model_config.float64 = c.float64;
  if (plan.dataset->is_token_data()) {
    plan.model_config.vocab_size = plan.dataset->num_classes();
    plan.model_config.seq_len = c.data.seq_len;
  }
  plan.dtype = c.float64 ? at::kDouble : at::kFloat;
  PT_ASSIGN_OR_RETURN(plan.layers, model::BuildModel(plan.model_config));
  std::vector<std::string> names;
  for (const auto& layer : plan.layers) names.push_back(layer->name());
  if (c.stage_ranges.empty()) {
    PT_ASSIGN_OR_RETURN(plan.partition,
                        model::BalancedPartition(model::ParameterCounts(plan.layers), c.stages));
  } else {
    plan.partition = c.stage_ranges;
  }
  PT_RETURN_IF_ERROR(model::ValidatePartition(plan.partition, names));
  const int n = static_cast<int>(plan.layers.size());
  plan.recompute.assign(n, false);
  switch (c.recompute.mode) {
    case RecomputeConfig::Mode::kNone:
      break;
    case RecomputeConfig::Mode::kAll:
      plan.recompute.assign(n, true);
      break;
    case RecomputeConfig::Mode::kStages:
      for (int s : c.recompute.indices) {
        for (int i = plan.partition[s].begin; i < plan.partition[s].end; ++i) {
          plan.recompute[i] = true;
        }
      }
      break;
    case RecomputeConfig::Mode::kLayers:
      for (int i : c.recompute.indices) {
        if (i >= n) {
          return absl::InvalidArgumentError(absl::StrCat(
              "recompute: layer ", i, " does not exist (the model has ", n, " layers)"));
        }
        plan.recompute[i] = true;
      }
      break;
  }
  plan.sampler = std::make_unique<data::BatchSampler>(
      plan.dataset->num_samples(), c.seed, /*replicas=*/1, c.micro_batches, c.micro_batch_size);
  return plan;
}

// Tensors for global micro-batch j from the sampler.
struct MicroBatchReader {
  const data::Dataset* dataset;
  const data::BatchSampler* sampler;
  int micro_batches;
  at::ScalarType dtype;

  data::MicroBatch Read(int64_t j) const {
    return dataset->Read(sampler->SampleIds(j / micro_batches, 0,
                                            static_cast<int>(j % micro_batches)));
  }
  at::Tensor Inputs(int64_t j) const {
    data::MicroBatch mb = Read(j);
    if (!mb.input_tokens.empty()) {
      return torch::tensor(mb.input_tokens, torch::kLong).reshape(mb.input_shape);
    }
    return torch::tensor(mb.input_values, torch::kFloat).reshape(mb.input_shape).to(dtype);
  }
  at::Tensor Targets(int64_t j) const {
    data::MicroBatch mb = Read(j);
    return torch::tensor(mb.targets, torch::kLong).reshape(mb.target_shape);
  }
};

std::vector<at::Tensor> DetachedCopies(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Steady-state step time of `kind` predicted by the simulator from measured mean compute
// time per (stage, action kind).
absl::StatusOr<double> IdealStepTime(const JobConfig& c,
                                     const std::vector<executor::StageStats>& stats) {
  const int p = static_cast<int>(stats.size());
  std::vector<std::map<ActionKind, std::pair<double, int>>> sums(p);
  for (int s = 0; s < p; ++s) {
    for (const auto& r : stats[s].records) {
      auto& [total, count] = sums[s][r.action.kind];
      total += r.end_s - r.start_s - r.wait_s;
      ++count;
    }
  }
  schedule::CostModel cost;
  cost.duration = [&sums](int stage, const schedule::Action& a) {
    auto it = sums[stage].find(a.kind);
    if (it == sums[stage].end() || it->second.second == 0) return 0.0;
    return it->second.first / it->second.second;
  };
  PT_ASSIGN_OR_RETURN(auto lists,
                      schedule::BuildSchedule({c.schedule, p, c.micro_batches, /*steps=*/3}));
  PT_ASSIGN_OR_RETURN(schedule::SimulationResult sim, schedule::Simulate(lists, cost));
  return sim.step_end_s[0][2] - sim.step_end_s[0][1];
}

// Emits progress in step order once both the step's end (stage 0) and its loss (last
// stage) are known.
class ProgressTracker {
 public:
  ProgressTracker(int64_t steps, double start_s, int64_t rows_per_step, int64_t tokens_per_row,
                  std::function<void(const Progress&)> sink)
      : steps_(steps), start_s_(start_s), rows_per_step_(rows_per_step),
        tokens_per_row_(tokens_per_row), sink_(std::move(sink)) {}

  void StepEnded(int64_t step, double end_s) {
    std::lock_guard<std::mutex> lock(mu_);
    ends_[step] = end_s;
    Flush();
  }
  void LossKnown(int64_t step, double loss) {
    std::lock_guard<std::mutex> lock(mu_);
    losses_[step] = loss;
    Flush();
  }

 private:
  void Flush() {
    while (ends_.count(next_) && losses_.count(next_)) {
      Progress p;
      p.step = next_;
      p.steps = steps_;
      p.loss = losses_[next_];
      p.elapsed_s = ends_[next_] - start_s_;
      if (next_ > 0) {
        const double dt = ends_[next_] - ends_[0];
        p.samples_per_s = dt > 0 ? rows_per_step_ * next_ / dt : 0;
      } else {
        p.samples_per_s = p.elapsed_s > 0 ? rows_per_step_ / p.elapsed_s : 0;
      }
      p.tokens_per_s = p.samples_per_s * tokens_per_row_;
      if (sink_) sink_(p);
      ++next_;
    }
  }
  std::mutex mu_;
  int64_t steps_;
  double start_s_;
  int64_t rows_per_step_, tokens_per_row_;
  std::function<void(const Progress&)> sink_;
  std::map<int64_t, double> ends_, losses_;
  int64_t next_ = 0;
};

}  // namespace

absl::StatusOr<JobReport> RunInProcess(const JobConfig& c, const RunOptions& options) {
  PT_ASSIGN_OR_RETURN(Plan plan, MakePlan(c));
  const int p = static_cast<int>(plan.partition.size());
  const int threads = c.threads_per_stage > 0 ? c.threads_per_stage
                                              : std::max(1, AvailableCores() / p);
  SetIntraOpThreads(threads);
  MicroBatchReader reader{plan.dataset.get(), plan.sampler.get(), c.micro_batches, plan.dtype};

  // Shapes crossing each stage boundary, from one forward of the whole model.
  std::vector<transport::TensorSpec> boundary(p + 1);
  {
    torch::NoGradGuard no_grad;
    model::LayerContext ctx;
    ctx.recomputing = true;  // a probe: BatchNorm must not count it
    at::Tensor x = reader.Inputs(0);
    boundary[0] = transport::SpecOf(x);
    for (int s = 0; s < p; ++s) {
      for (int i = plan.partition[s].begin; i < plan.partition[s].end; ++i) {
        ctx.global_layer = i;
        x = plan.layers[i]->Forward(x, ctx);
      }
      boundary[s + 1] = transport::SpecOf(x);
    }
  }

  auto hub = transport::MakeInProcessHub();
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<weights::WeightStore>> stores;
  std::vector<std::unique_ptr<executor::StageExecutor>> executors;
  const double start_s = MonotonicSeconds();
  const int64_t rows_per_step = int64_t{c.micro_batches} * c.micro_batch_size;
  const int64_t tokens_per_row = plan.dataset->is_token_data() ? c.data.seq_len : 1;
  ProgressTracker tracker(c.steps, start_s, rows_per_step, tokens_per_row, options.on_progress);
  std::vector<double> losses(c.steps, 0.0);

  for (int s = 0; s < p; ++s) {
    const model::LayerRange r = plan.partition[s];
    auto module = std::make_unique<model::StageModule>(
        r.begin, model::CloneLayers(plan.layers, r.begin, r.end),
        std::vector<bool>(plan.recompute.begin() + r.begin, plan.recompute.begin() + r.end));
    PT_ASSIGN_OR_RETURN(auto optimizer, weights::MakeOptimizer(c.optimizer));
    std::unique_ptr<weights::WeightStore> store;
    if (c.schedule == schedule::ScheduleKind::kTwoBW) {
      PT_ASSIGN_OR_RETURN(store, weights::MakeDoubleBufferedWeights(
                                     std::move(module), std::move(optimizer), c.micro_batches));
    } else {
      PT_ASSIGN_OR_RETURN(store,
                          weights::MakeSingleVersionWeights(std::move(module), std::move(optimizer)));
    }
    executor::StageConfig sc;
    sc.stage = s;
    sc.num_stages = p;
    sc.micro_batches = c.micro_batches;
    sc.seed = c.seed;
    sc.recv_timeout = absl::Seconds(c.recv_timeout_s);
    PT_ASSIGN_OR_RETURN(sc.actions, schedule::BuildStageSchedule(
                                        {c.schedule, p, c.micro_batches, c.steps}, s));
    if (s == 0) sc.inputs = [&reader](int64_t j) -> absl::StatusOr<at::Tensor> {
      return reader.Inputs(j);
    };
    if (s == p - 1) sc.targets = [&reader](int64_t j) -> absl::StatusOr<at::Tensor> {
      return reader.Targets(j);
    };
    sc.expected_input = boundary[s];
    sc.expected_output_grad = boundary[s + 1];
    transports.push_back(transport::MakeInProcessTransport(hub, s));
    if (options.wrap_transport) {
      transports.back() = options.wrap_transport(std::move(transports.back()), s);
    }
    std::function<void(const executor::StepRecord&)> on_step =
        [&tracker, &losses, s](const executor::StepRecord& step) {
          if (step.mean_loss) {
            losses[step.step] = *step.mean_loss;
            tracker.LossKnown(step.step, *step.mean_loss);
          }
          if (s == 0) tracker.StepEnded(step.step, step.end_s);
        };
    executors.push_back(std::make_unique<executor::StageExecutor>(
        std::move(sc), store.get(), transports.back().get(), on_step));
    stores.push_back(std::move(store));
  }

  std::vector<absl::Status> results(p);
  {
    std::vector<std::thread> workers;
    for (int s = 0; s < p; ++s) {
      workers.emplace_back([&, s] {
        SetIntraOpThreads(threads);
        results[s] = executors[s]->Run();
      });
    }
    for (auto& w : workers) w.join();
  }
  // Report the root cause (the first error that is not another stage's abort) and where
  // every stage stopped, so a hang or a failure can be read off one line.
  const absl::Status* root = nullptr;
  for (const absl::Status& st : results) {
    if (!st.ok() && (root == nullptr || (absl::IsAborted(*root) && !absl::IsAborted(st)))) {
      root = &st;
    }
  }
  if (root != nullptr) {
    std::vector<std::string> positions;
    for (int s = 0; s < p; ++s) {
      const auto& at = executors[s]->stopped_at();
      positions.push_back(absl::StrCat("stage ", s, " ",
                                       at ? schedule::ToString(*at) : std::string("finished")));
    }
    return absl::Status(root->code(), absl::StrCat(root->message(), " [stopped at: ",
                                                   absl::StrJoin(positions, ", "), "]"));
  }

  JobReport report;
  report.schedule = std::string(schedule::ScheduleKindName(c.schedule));
  report.stages = p;
  report.micro_batches = c.micro_batches;
  report.micro_batch_size = c.micro_batch_size;
  report.steps = c.steps;
  report.partition = plan.partition;
  report.losses = losses;
  report.data_entropy = plan.dataset->entropy_nats();
  report.data_summary = plan.dataset->Describe();
  double params = 0;
  for (double n : model::ParameterCounts(plan.layers)) params += n;
  report.model_summary = absl::StrCat(c.model.name, ": ", plan.layers.size(), " layers, ",
                                      static_cast<int64_t>(params), " parameters");
  report.threads_per_stage = threads;
  report.wall_s = MonotonicSeconds() - start_s;
  for (int s = 0; s < p; ++s) {
    const executor::StageStats& st = executors[s]->stats();
    report.per_stage.push_back({s, plan.partition[s], st.peak_stashed_microbatches,
                                st.peak_weight_versions, st.compute_s, st.wait_s});
    report.stage_stats.push_back(st);
    for (const at::Tensor& t : DetachedCopies(stores[s]->Newest().Parameters())) {
      report.final_parameters.push_back(t);
    }
    for (const at::Tensor& t : DetachedCopies(stores[s]->Newest().Buffers())) {
      report.final_buffers.push_back(t);
    }
  }
  const auto& steps0 = report.stage_stats[0].steps;
  std::vector<double> step_times;
  for (size_t i = 1; i < steps0.size(); ++i) {
    step_times.push_back(steps0[i].end_s - steps0[i - 1].end_s);
  }
  report.step_time_s =
      step_times.empty() ? steps0.back().end_s - start_s : Median(step_times);
  if (steps0.size() > 1) {
    const double dt = steps0.back().end_s - steps0.front().end_s;
    report.samples_per_s = rows_per_step * (steps0.size() - 1) / dt;
  } else {
    report.samples_per_s = rows_per_step / (steps0.back().end_s - start_s);
  }
  report.tokens_per_s = report.samples_per_s * tokens_per_row;
  report.token_data = plan.dataset->is_token_data();
  PT_ASSIGN_OR_RETURN(report.ideal_step_time_s, IdealStepTime(c, report.stage_stats));
  return report;
}

absl::StatusOr<std::vector<at::Tensor>> TrainReference(const JobConfig& c) {
  PT_ASSIGN_OR_RETURN(Plan plan, MakePlan(c));
  SetIntraOpThreads(AvailableCores());
  MicroBatchReader reader{plan.dataset.get(), plan.sampler.get(), c.micro_batches, plan.dtype};
  const int n = static_cast<int>(plan.layers.size());
  model::StageModule current(0, model::CloneLayers(plan.layers, 0, n));
  std::unique_ptr<model::StageModule> previous;  // W(t-1), 2BW only
  const bool two_bw = c.schedule == schedule::ScheduleKind::kTwoBW;
  if (two_bw) previous = current.Clone();
  model::StageModule& grad_module = two_bw ? *previous : current;

  std::vector<at::Tensor> params = current.Parameters();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  const weights::OptimizerConfig& o = c.optimizer;
  if (o.name == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr)
                    .betas({o.beta1, o.beta2})
                    .eps(o.eps)
                    .weight_decay(o.weight_decay));
  }
  try {
    for (int64_t t = 0; t < c.steps; ++t) {
      for (int i = 0; i < c.micro_batches; ++i) {
        const int64_t j = t * c.micro_batches + i;
        model::LayerContext ctx;
        ctx.micro_batch = j;
        ctx.mini_batch = t;
        ctx.seed = c.seed;
        at::Tensor logits = grad_module.Forward(reader.Inputs(j), ctx);
        at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                 reader.Targets(j).reshape({-1}));
        (loss * (1.0 / c.micro_batches)).backward();
      }
      if (two_bw) {
        // grad f(W(t-1)) is on `previous`; W(t-1) is then replaced by W(t).
        std::vector<at::Tensor> grads = weights::GradientsOf(previous->Parameters());
        previous->CopyWeightsFrom(current);
        for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[k].clone();
        previous->ZeroGrad();
      }
      optimizer->step();
      optimizer->zero_grad();
      current.FinishMiniBatch(t);
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
