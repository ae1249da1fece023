#include "runtime/job/plan.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "runtime/model/torchscript_model.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::job {
namespace {

absl::StatusOr<std::unique_ptr<data::Dataset>> MakeDataset(const JobSpec& c) {
  const std::string kind = DataKindOf(c);
  data::TokenDataOptions window{c.data().seq_len()};
  if (kind == "synthetic") {
    data::SyntheticCorpusOptions o;
    o.vocab = c.data().vocab();
    o.branching = c.data().branching();
    o.num_tokens = c.data().num_tokens();
    o.seed = c.data().seed();
    o.window = window;
    return data::MakeSyntheticCorpus(o);
  }
  if (kind == "bytes") return data::OpenByteFile(c.data().path(), window);
  if (kind == "uint16") return data::OpenUint16TokenFile(c.data().path(), window, c.data().vocab());
  data::SyntheticClassificationOptions o;
  o.sample_shape = c.model().name() == "cnn" || c.model().name() == "vgg"
                       ? ModelConfigOf(c).image_shape
                       : std::vector<int64_t>{c.model().input_dim()};
  o.num_classes = c.model().num_classes();
  o.num_samples = c.data().num_samples();
  o.seed = c.data().seed();
  return data::MakeSyntheticClassification(o);
}

// Shapes crossing each stage boundary of a built-in model, by formula (model_config.h).
absl::Status BuiltinBoundaries(JobPlan& plan) {
  for (int s = 0; s < plan.stages(); ++s) {
    std::vector<int64_t> shape = plan.boundary[s].shape;
    for (int i = plan.partition[s].begin; i < plan.partition[s].end; ++i) {
      absl::StatusOr<std::vector<int64_t>> out =
          model::BuiltinLayerOutputShape(plan.model_config, i, shape);
      if (!out.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the model does not accept the data: ", out.status().message()));
      }
      shape = *std::move(out);
    }
    plan.boundary[s + 1] = {shape, plan.compute_dtype};
  }
  return absl::OkStatus();
}

// Shapes crossing each stage boundary of a TorchScript model, from one forward of micro-batch
// 0 through all of its layers (marked as recomputation so that BatchNorm does not count it).
absl::Status ProbeBoundaries(JobPlan& plan, const model::LayerList& layers, at::Tensor x) {
  try {
    at::NoGradGuard no_grad;
    model::LayerContext ctx;
    ctx.recomputing = true;
    for (int s = 0; s < plan.stages(); ++s) {
      for (int i = plan.partition[s].begin; i < plan.partition[s].end; ++i) {
        ctx.global_layer = i;
        x = layers[i]->Forward(x, ctx);
      }
      plan.boundary[s + 1] = transport::SpecOf(x);
      // Floating activations travel in the job's compute dtype (bfloat16 mixed precision).
      if (plan.boundary[s + 1].dtype == plan.dtype) plan.boundary[s + 1].dtype = plan.compute_dtype;
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    return absl::InvalidArgumentError(
        absl::StrCat("the model does not accept the data: ", what.substr(0, what.find('\n'))));
  }
  return absl::OkStatus();
}

// A status from loading the model file, naming the field that holds its path.
absl::Status ModelFileError(const absl::Status& s) {
  if (absl::StartsWith(s.message(), "model.path")) return s;
  return absl::Status(s.code(), absl::StrCat("model.path: ", s.message()));
}

}  // namespace

std::vector<std::string> JobPlan::layer_names() const {
  std::vector<std::string> names;
  for (const model::LayerInfo& layer : layers) names.push_back(layer.name);
  return names;
}

int64_t JobPlan::num_parameters() const {
  int64_t n = 0;
  for (const model::LayerInfo& layer : layers) n += layer.num_parameters;
  return n;
}

absl::StatusOr<JobPlan> MakeJobPlan(const JobSpec& c) {
  PT_RETURN_IF_ERROR(ValidateJob(c));
  if (c.auto_stages()) {
    return absl::FailedPreconditionError(
        "stages: auto: the layout must be planned before the job runs (pipetrain plan)");
  }
  JobPlan plan;
  absl::StatusOr<std::unique_ptr<data::Dataset>> dataset = MakeDataset(c);
  if (!dataset.ok()) {  // a data file that cannot be read: the field that names it
    const std::string kind = DataKindOf(c);
    return (kind == "bytes" || kind == "uint16")
               ? absl::Status(dataset.status().code(),
                              absl::StrCat("data.path: ", dataset.status().message()))
               : dataset.status();
  }
  plan.dataset = *std::move(dataset);
  plan.model_config = ModelConfigOf(c);
  plan.model_config.seed = c.seed();
  plan.model_config.float64 = PrecisionOf(c) == Precision::kFloat64;
  if (plan.dataset->is_token_data()) {
    plan.model_config.vocab_size = plan.dataset->num_classes();
    plan.model_config.seq_len = c.data().seq_len();
  }
  plan.dtype = PrecisionOf(c) == Precision::kFloat64 ? at::kDouble : at::kFloat;
  plan.compute_dtype = PrecisionOf(c) == Precision::kBFloat16 ? at::kBFloat16 : plan.dtype;
  // A TorchScript model is loaded (whole) only here, to learn its layers and shapes.
  model::LayerList script_layers;
  if (c.model().name() == "torchscript") {
    absl::StatusOr<model::LayerList> loaded = model::BuildModel(plan.model_config);
    if (!loaded.ok()) return ModelFileError(loaded.status());
    script_layers = *std::move(loaded);
    const std::vector<double> counts = model::ParameterCounts(script_layers);
    for (size_t i = 0; i < script_layers.size(); ++i) {
      plan.layers.push_back({script_layers[i]->name(), static_cast<int64_t>(counts[i]),
                             script_layers[i]->ParameterKindsOf()});
    }
  } else {
    PT_ASSIGN_OR_RETURN(plan.layers, model::BuiltinLayers(plan.model_config));
  }
  plan.layout = schedule::LayoutOf(ScheduleParamsOf(c, 1));
  plan.ties = model::TiedParameters(plan.model_config);
  if (!c.model().tie().empty()) {
    if (c.model().name() != "torchscript") {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.tie: only a torchscript model names tie groups (a gpt ties its embedding and "
          "head with tie_embeddings), not ",
          c.model().name()));
    }
    PT_ASSIGN_OR_RETURN(std::vector<model::TieGroup> named,
                        model::ScriptTieGroups(script_layers, job::ModelConfigOf(c).tie));
    plan.ties.insert(plan.ties.end(), named.begin(), named.end());
  }
  if (StageRangesOf(c).empty()) {
    std::vector<double> costs;
    for (const model::LayerInfo& layer : plan.layers) {
      costs.push_back(static_cast<double>(layer.num_parameters));
    }
    PT_ASSIGN_OR_RETURN(plan.partition, model::BalancedPartition(costs, plan.layout.stages()));
  } else {
    plan.partition = StageRangesOf(c);
  }
  PT_RETURN_IF_ERROR(model::ValidatePartition(plan.partition, plan.layer_names()));
  const int n = static_cast<int>(plan.layers.size());
  plan.recompute.assign(n, false);
  switch (RecomputeOf(c).mode) {
    case RecomputeConfig::Mode::kNone: break;
    case RecomputeConfig::Mode::kAll: plan.recompute.assign(n, true); break;
    case RecomputeConfig::Mode::kStages:
      for (int s : RecomputeOf(c).indices) {
        for (int i = plan.partition[s].begin; i < plan.partition[s].end; ++i) {
          plan.recompute[i] = true;
        }
      }
      break;
    case RecomputeConfig::Mode::kLayers:
      for (int i : RecomputeOf(c).indices) {
        if (i >= n) {
          return absl::InvalidArgumentError(absl::StrCat(
              "recompute: layer ", i, " does not exist (the model has ", n, " layers)"));
        }
        plan.recompute[i] = true;
      }
      break;
  }
  plan.train_samples = plan.dataset->num_samples();
  plan.eval_batches = c.eval().batches();
  plan.micro_batch_size = c.microbatch_size();
  if (c.eval().split() > 0) {
    const int64_t n = plan.dataset->num_samples();
    const int64_t gap = plan.dataset->is_token_data() ? 1 : 0;
    plan.held_out.count =
        std::max<int64_t>(1, static_cast<int64_t>(std::floor(c.eval().split() * n)));
    plan.held_out.begin = n - plan.held_out.count;
    plan.train_samples = plan.held_out.begin - gap;
    if (plan.train_samples < 1) {
      return absl::InvalidArgumentError(absl::StrCat("eval.split: holding out ",
                                                     plan.held_out.count, " of the data's ", n,
                                                     " samples leaves none to train on"));
    }
  }
  plan.sampler = std::make_unique<data::BatchSampler>(plan.train_samples, c.seed(), c.replicas(),
                                                      c.microbatches(), c.microbatch_size());
  plan.boundary.assign(plan.stages() + 1, {});
  at::Tensor first_input = MicroBatchReader(plan, c.microbatches()).Inputs(0);
  plan.boundary[0] = transport::SpecOf(first_input);
  if (script_layers.empty()) {
    PT_RETURN_IF_ERROR(BuiltinBoundaries(plan));
  } else {
    PT_RETURN_IF_ERROR(ProbeBoundaries(plan, script_layers, first_input));
  }
  return plan;
}

std::vector<weights::WeightStore*> StageParts::weight_stores() const {
  std::vector<weights::WeightStore*> out;
  for (const auto& w : weights) out.push_back(w.get());
  return out;
}

std::vector<model::LayerRange> RankLayers(const JobPlan& plan, int stage) {
  std::vector<model::LayerRange> ranges;
  for (int s : plan.layout.StagesOf(stage)) ranges.push_back(plan.partition[s]);
  return ranges;
}

namespace {

// Model stage `s`'s module: its own layers, on `device`.
absl::StatusOr<std::unique_ptr<model::StageModule>> BuildModule(const JobSpec& c,
                                                                const JobPlan& plan, int s,
                                                                c10::Device device) {
  const model::LayerRange r = plan.partition[s];
  absl::StatusOr<model::LayerList> layers = model::BuildLayers(plan.model_config, r.begin, r.end);
  if (!layers.ok()) {
    return c.model().name() == "torchscript" ? ModelFileError(layers.status()) : layers.status();
  }
  auto module = std::make_unique<model::StageModule>(
      r.begin, *std::move(layers),
      std::vector<bool>(plan.recompute.begin() + r.begin, plan.recompute.begin() + r.end));
  module->SetComputeDtype(plan.compute_dtype);
  if (!device.is_cpu()) module->ToDevice(device);
  return module;
}

// The position of tied member `ref` in its module's Parameters().
int ParameterIndex(const model::StageModule& module, const model::ParameterRef& ref) {
  int index = 0;  // the parameters of the stage's layers before the member's
  for (int i = 0; i < ref.layer - module.first_layer(); ++i) {
    index += static_cast<int>(module.layers()[i]->Parameters().size());
  }
  return index + ref.parameter;
}

// The module of `modules` (model stages `stages`) that holds global layer `layer`, or -1.
int ModuleHolding(const std::vector<int>& stages, const JobPlan& plan, int layer) {
  for (size_t k = 0; k < stages.size(); ++k) {
    const model::LayerRange r = plan.partition[stages[k]];
    if (r.begin <= layer && layer < r.end) return static_cast<int>(k);
  }
  return -1;
}

// Each tie group's members on this rank share the storage of the first of them: one
// parameter on the rank, of the group's first member's kinds. Members in two modules only
// under one weight version (the schedules with chunks), since a module that shares another's
// parameter is never cloned.
absl::Status ShareTiedParameters(const JobSpec& c, const JobPlan& plan,
                                 const std::vector<int>& stages,
                                 std::vector<std::unique_ptr<model::StageModule>>& modules) {
  for (const model::TieGroup& group : plan.ties) {
    int owner_module = -1;
    at::Tensor owner;
    for (const model::ParameterRef& ref : group) {
      const int k = ModuleHolding(stages, plan, ref.layer);
      if (k < 0) continue;
      const int index = ParameterIndex(*modules[k], ref);
      const std::vector<at::Tensor> params = modules[k]->Parameters();
      if (index >= static_cast<int>(params.size())) {
        return absl::InternalError(absl::StrCat("tied parameter ", ref.parameter, " of layer ",
                                                ref.layer, " does not exist"));
      }
      // Every member is of the first member's kinds (weight decay's groups), wherever that is.
      const model::ParameterRef& first = group.front();
      const std::vector<model::ParameterKinds>* first_kinds =
          first.layer < static_cast<int>(plan.layers.size())
              ? &plan.layers[static_cast<size_t>(first.layer)].parameter_kinds
              : nullptr;
      if (first_kinds == nullptr || first.parameter >= static_cast<int>(first_kinds->size())) {
        return absl::InternalError(absl::StrCat("tied parameter ", first.parameter, " of layer ",
                                                first.layer, " has no kind"));
      }
      modules[k]->SetParameterKinds(index, (*first_kinds)[static_cast<size_t>(first.parameter)]);
      if (owner_module < 0) {
        owner_module = k;
        owner = params[static_cast<size_t>(index)];
        continue;
      }
      if (k != owner_module &&
          schedule::WeightsOf(ScheduleOf(c)) != schedule::WeightPolicy::kFlush) {
        return absl::InternalError(absl::StrCat(
            "tied layers ", group.front().layer, " and ", ref.layer,
            " are in two model stages of one rank under a schedule of several weight versions"));
      }
      PT_RETURN_IF_ERROR(modules[k]->ShareParameter(index, owner));
    }
  }
  return absl::OkStatus();
}

// The weights of model stage `s` in `module`, from `start`'s layers (those of its layers from
// `first` on) when it resumes.
absl::StatusOr<std::unique_ptr<weights::WeightStore>> BuildModelStageWeights(
    const JobSpec& c, const JobPlan& plan, int s, std::unique_ptr<model::StageModule> module,
    const StageStart& start, size_t first) {
  const model::LayerRange r = plan.partition[s];
  std::vector<weights::ParameterState> optimizer_state;
  const bool resumed = !start.layers.empty();
  const schedule::WeightPolicy weights = schedule::WeightsOf(ScheduleOf(c));
  std::unique_ptr<model::StageModule> stale;  // 2BW resumed: W(N-1), where the checkpoint has it
  if (resumed) {
    const std::vector<checkpoint::LayerState> own(
        start.layers.begin() + static_cast<std::ptrdiff_t>(first),
        start.layers.begin() + static_cast<std::ptrdiff_t>(first + (r.end - r.begin)));
    auto loaded = checkpoint::LoadLayerStates(own, module.get());
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("resume_from: ", loaded.status().message()));
    }
    optimizer_state = *std::move(loaded);
    if (weights == schedule::WeightPolicy::kDoubleBuffered && checkpoint::HaveStaleVersion(own)) {
      stale = module->Clone();
      if (absl::Status st = checkpoint::LoadStaleLayerStates(own, stale.get()); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("resume_from: ", st.message()));
      }
    }
  }
  PT_ASSIGN_OR_RETURN(auto optimizer, weights::MakeOptimizer(OptimizerConfigOf(c), c.steps()));
  std::unique_ptr<weights::WeightStore> store;
  if (weights == schedule::WeightPolicy::kDoubleBuffered) {
    PT_ASSIGN_OR_RETURN(store, weights::MakeDoubleBufferedWeights(
                                   std::move(module), std::move(optimizer), c.microbatches(),
                                   start.first_step, std::move(stale)));
  } else if (weights == schedule::WeightPolicy::kStashed) {
    PT_ASSIGN_OR_RETURN(store, weights::MakeStashedWeights(std::move(module), std::move(optimizer),
                                                           c.microbatches(), start.first_step,
                                                           c.vertical_sync() && s > 0));
  } else {
    PT_ASSIGN_OR_RETURN(store, weights::MakeSingleVersionWeights(
                                   std::move(module), std::move(optimizer), start.first_step));
  }
  if (resumed) {
    if (absl::Status st = store->LoadOptimizerState(optimizer_state); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("resume_from: ", st.message()));
    }
  }
  return store;
}

// The model's tie groups as the executor sees them: the ranks holding a copy and, for this
// rank's, its owner's model stage and index in that stage's OwnParameters().
std::vector<executor::TiedParameter> TiedParametersOf(const JobPlan& plan, int rank,
                                                      const StageParts& parts) {
  std::vector<executor::TiedParameter> tied;
  for (const model::TieGroup& group : plan.ties) {
    executor::TiedParameter tie;
    for (const model::ParameterRef& ref : group) {
      int stage = 0;
      while (stage < plan.stages() && plan.partition[stage].end <= ref.layer) ++stage;
      const int holder = plan.layout.RankOf(stage);
      if (std::any_of(tie.copies.begin(), tie.copies.end(),
                      [holder](const auto& copy) { return copy.rank == holder; })) {
        continue;  // a member that shares this rank's copy
      }
      executor::TiedParameter::Copy copy;
      copy.rank = holder;
      if (holder == rank) {
        const int k = ModuleHolding(parts.model_stages, plan, ref.layer);
        const model::StageModule& module = parts.weights[k]->Newest();
        const int index = ParameterIndex(module, ref);
        copy.stage = stage;
        copy.parameter = index;
        for (int i = 0; i < index; ++i) copy.parameter -= module.IsShared(i) ? 1 : 0;
      }
      tie.copies.push_back(copy);
    }
    tied.push_back(std::move(tie));
  }
  return tied;
}

}  // namespace

absl::StatusOr<StageParts> BuildStage(const JobSpec& c, const JobPlan& plan,
                                      const MicroBatchReader& reader, int stage,
                                      const StageStart& start, c10::Device device) {
  const int p = plan.ranks(), last = plan.stages() - 1;
  if (start.generation.commit_steps) {
    if (std::string why = CommitStepsRefusal(c); !why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("commit_steps: ", why));
    }
  }
  StageParts parts;
  parts.model_stages = plan.layout.StagesOf(stage);
  size_t first_layer = 0;  // of the next model stage in start.layers
  size_t rank_layers = 0;
  for (const model::LayerRange& r : RankLayers(plan, stage)) rank_layers += r.end - r.begin;
  if (!start.layers.empty() && start.layers.size() != rank_layers) {
    return absl::InternalError(absl::StrCat("resume_from: ", start.layers.size(),
                                            " layers read for a rank of ", rank_layers));
  }
  std::vector<std::unique_ptr<model::StageModule>> modules;
  for (int s : parts.model_stages) {
    PT_ASSIGN_OR_RETURN(std::unique_ptr<model::StageModule> module,
                        BuildModule(c, plan, s, device));
    modules.push_back(std::move(module));
  }
  PT_RETURN_IF_ERROR(ShareTiedParameters(c, plan, parts.model_stages, modules));
  for (size_t k = 0; k < modules.size(); ++k) {
    for (const at::Tensor& t : modules[k]->OwnParameters()) {
      parts.parameter_bytes += static_cast<int64_t>(t.numel() * t.element_size());
    }
    const int s = parts.model_stages[k];
    PT_ASSIGN_OR_RETURN(
        std::unique_ptr<weights::WeightStore> store,
        BuildModelStageWeights(c, plan, s, std::move(modules[k]), start, first_layer));
    parts.weights.push_back(std::move(store));
    first_layer += plan.partition[s].end - plan.partition[s].begin;
  }
  executor::StageConfig& sc = parts.config;
  sc.stage = stage;
  sc.num_stages = p;
  sc.micro_batches = c.microbatches();
  sc.replicas = c.replicas();
  sc.replica = reader.replica();
  sc.overlap_allreduce = c.overlap_allreduce();
  sc.bucket_bytes = c.bucket_kib() * 1024;
  sc.vertical_sync = c.vertical_sync();
  sc.seed = c.seed();
  sc.recv_timeout = absl::Seconds(c.timeout_s());
  sc.schedule = ScheduleParamsOf(c, c.steps());
  sc.schedule.first_step = start.first_step;
  sc.checkpoint_every = c.checkpoint().every();
  sc.nonfinite_limit = c.nonfinite_limit();
  sc.skipped_in_a_row = start.generation.skipped_in_a_row;
  sc.clip_grad_norm = c.optimizer().clip_grad_norm();
  sc.commit_steps = start.generation.commit_steps;
  sc.eval_every = c.eval().every();
  sc.eval_batches = c.eval().batches();
  PT_RETURN_IF_ERROR(schedule::ValidateScheduleParams(sc.schedule));
  const auto holds = [&](int s) {
    return std::count(parts.model_stages.begin(), parts.model_stages.end(), s) > 0;
  };
  if (holds(0)) {
    sc.inputs = [&reader, device](int64_t j) -> absl::StatusOr<at::Tensor> {
      return reader.Inputs(j).to(device);
    };
    sc.eval_inputs = [&reader, device](int64_t k) -> absl::StatusOr<at::Tensor> {
      return reader.EvalInputs(k).to(device);
    };
  }
  if (holds(last)) {
    sc.targets = [&reader, device](int64_t j) -> absl::StatusOr<at::Tensor> {
      return reader.Targets(j).to(device);
    };
    sc.eval_targets = [&reader, device](int64_t k) -> absl::StatusOr<at::Tensor> {
      return reader.EvalTargets(k).to(device);
    };
  }
  sc.boundaries = plan.boundary;
  sc.tied = TiedParametersOf(plan, stage, parts);
  return parts;
}

int ThreadsPerStage(const JobSpec& c, int stages) {
  return c.threads_per_stage() > 0 ? c.threads_per_stage() : std::max(1, AvailableCores() / stages);
}

}  // namespace pipetrain::job
