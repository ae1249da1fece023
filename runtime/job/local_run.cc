#include "runtime/job/local_run.h"
#include "runtime/job/stage_run.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <thread>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/clock.h"
#include "runtime/base/process_memory.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/job/checkpointing.h"
#include "runtime/job/device.h"
#include "runtime/job/plan.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {
absl::StatusOr<JobReport> RunInProcess(const JobConfig& c, const RunOptions& options) {
  PT_RETURN_IF_ERROR(CheckWeightsDir(c));
  PT_ASSIGN_OR_RETURN(JobPlan plan, MakeJobPlan(c));
  const int p = plan.stages(), w = c.replicas;
  PT_ASSIGN_OR_RETURN(std::optional<checkpoint::FoundCheckpoint> resume, FindResumePoint(c, plan));
  if (resume) {
    for (const std::string& why : resume->skipped) {
      std::fprintf(stderr, "pipetrain: resume_from: passed over %s\n", why.c_str());
    }
    std::fprintf(stderr, "pipetrain: resuming at step %lld from %s\n",
                 static_cast<long long>(resume->manifest.step), resume->dir.c_str());
    if (options.commands) options.commands->StartAt(resume->manifest.step);
  }
  CheckpointSink sink(c, plan);
  const int threads = ThreadsPerStage(c, p * w);
  SetIntraOpThreads(threads);
  std::vector<std::unique_ptr<MicroBatchReader>> readers;
  for (int r = 0; r < w; ++r) {
    readers.push_back(std::make_unique<MicroBatchReader>(plan, c.micro_batches, r));
  }

  // Stages as threads share one device (GPU 0 of a device: cuda job).
  PT_ASSIGN_OR_RETURN(c10::Device device, DeviceForRank(c, 0));
  auto hub = transport::MakeInProcessHub();
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<StageParts> stages;
  std::vector<std::unique_ptr<executor::StageExecutor>> executors;
  const double start_s = MonotonicSeconds();
  const int64_t first_step = resume ? resume->manifest.step : 0;
  ProgressTracker tracker(c, plan, start_s, options.on_progress, first_step);
  // Replica-major: index r * p + s.
  for (int r = 0; r < w; ++r) {
    for (int s = 0; s < p; ++s) {
      PT_ASSIGN_OR_RETURN(StageStart start, StageStartFrom(resume, plan, s));
      PT_ASSIGN_OR_RETURN(StageParts parts, BuildStage(c, plan, *readers[r], s, start, device));
      if (s == 0 && r == 0) parts.config.commands = options.commands.get();
      transports.push_back(transport::MakeInProcessTransport(hub, s, r, w));
      if (options.wrap_transport) {
        transports.back() = options.wrap_transport(std::move(transports.back()), s);
      }
      weights::WeightStore* weights = parts.weights.get();
      auto on_step = [&tracker, &sink, &c, weights, s, r](const executor::StepRecord& step) {
        if (r == 0 && (step.commands_after & control::kCheckpoint) && !c.checkpoint.dir.empty()) {
          // A failed checkpoint costs only itself: the job goes on (the error is reported).
          if (absl::Status saved = sink.Deliver(step.step + 1, s, *weights); !saved.ok()) {
            std::fprintf(stderr, "pipetrain: stage %d: checkpoint before step %lld failed: %s\n",
                         s, static_cast<long long>(step.step + 1),
                         std::string(saved.message()).c_str());
          }
        }
        if (step.mean_loss) tracker.LossKnown(step.step, *step.mean_loss);
        if (s == 0 && r == 0) tracker.StepEnded(step.step, step.end_s);
      };
      executors.push_back(std::make_unique<executor::StageExecutor>(
          parts.config, parts.weights.get(), transports.back().get(), on_step));
      stages.push_back(std::move(parts));
    }
  }

  const int n = p * w;
  std::vector<absl::Status> results(n);
  {
    std::vector<std::thread> workers;
    for (int s = 0; s < n; ++s) {
      workers.emplace_back([&, s] {
        SetIntraOpThreads(threads);
        results[s] = executors[s]->Run();
      });
    }
    for (auto& w : workers) w.join();
  }
  std::vector<std::optional<schedule::Action>> stopped_at;
  for (const auto& e : executors) stopped_at.push_back(e->stopped_at());
  PT_RETURN_IF_ERROR(StoppedStagesError(results, stopped_at));

  const int64_t peak_memory = PeakResidentMemoryBytes();  // one process: shared by stages
  // One process: its stages share the CPU counter, or the GPU they all run on.
  // -1 (a GPU's, not known without a CUDA LibTorch) is reported as 0: not measured.
  const int64_t peak_tensors = std::max<int64_t>(0, memory::PeakTensorBytesOn(device));
  std::vector<StageOutcome> outcomes;
  for (int s = 0; s < n; ++s) {
    outcomes.push_back({executors[s]->stats(), DetachedParameters(*stages[s].weights),
                        DetachedBuffers(*stages[s].weights), stages[s].parameter_bytes,
                        peak_memory, peak_tensors, transports[s]->bytes_sent()});
    PT_RETURN_IF_ERROR(SaveStageWeights(c, s, outcomes.back()));
  }
  PT_ASSIGN_OR_RETURN(JobReport report,
                      AssembleReport(c, plan, std::move(outcomes), tracker.Losses(), start_s));
  report.first_step = first_step;
  return report;
}

absl::StatusOr<std::vector<at::Tensor>> TrainReference(const JobConfig& c,
                                                       const std::vector<int64_t>& switch_at) {
  PT_ASSIGN_OR_RETURN(JobPlan plan, MakeJobPlan(c));
  SetIntraOpThreads(AvailableCores());
  std::vector<std::unique_ptr<MicroBatchReader>> readers;
  for (int r = 0; r < c.replicas; ++r) {
    readers.push_back(std::make_unique<MicroBatchReader>(plan, c.micro_batches, r));
  }
  PT_ASSIGN_OR_RETURN(model::LayerList layers, model::BuildModel(plan.model_config));
  model::StageModule current(0, std::move(layers));
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
      if (two_bw && std::count(switch_at.begin(), switch_at.end(), t) > 0) {
        previous->CopyWeightsFrom(current);  // mini-batch t runs on W(t), not W(t-1)
      }
      // The whole global batch: every replica's shard, micro-batch by micro-batch.
      for (const auto& reader : readers) {
        for (int i = 0; i < c.micro_batches; ++i) {
          const int64_t j = t * c.micro_batches + i;
          model::LayerContext ctx;
          ctx.micro_batch = j;
          ctx.mini_batch = t;
          ctx.seed = c.seed;
          at::Tensor logits = grad_module.Forward(reader->Inputs(j), ctx);
          at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                                   reader->Targets(j).reshape({-1}));
          (loss * (1.0 / (c.micro_batches * c.replicas))).backward();
        }
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
