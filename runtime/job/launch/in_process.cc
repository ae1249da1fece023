// Stages as threads of one process. See in_process.h.
#include "runtime/job/launch/in_process.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "runtime/job/launch/stage_run.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/clock.h"
#include "runtime/base/process_memory.h"
#include "runtime/base/status_macros.h"
#include "runtime/base/threads.h"
#include "runtime/checkpoint/job_checkpoints.h"
#include "runtime/job/device.h"
#include "runtime/job/plan.h"
#include "runtime/memory/tensor_memory.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {
absl::StatusOr<JobReport> RunInProcess(const JobSpec& c, const RunOptions& options) {
  PT_RETURN_IF_ERROR(CheckWeightsDir(c));
  PT_ASSIGN_OR_RETURN(JobPlan plan, MakeJobPlan(c));
  const int p = plan.ranks(), w = c.replicas();
  PT_ASSIGN_OR_RETURN(std::optional<checkpoint::FoundCheckpoint> resume,
                      checkpoint::FindResumePoint(c, plan));
  if (resume) {
    for (const std::string& why : resume->skipped) {
      std::fprintf(stderr, "pipetrain: resume_from: passed over %s\n", why.c_str());
    }
    std::fprintf(stderr, "pipetrain: resuming at step %lld from %s\n",
                 static_cast<long long>(resume->manifest.step), resume->dir.c_str());
    if (options.commands) options.commands->StartAt(resume->manifest.step);
  }
  checkpoint::CheckpointSink sink(c, plan);
  const int threads = ThreadsPerStage(c, p * w);
  SetIntraOpThreads(threads);
  std::vector<std::unique_ptr<MicroBatchReader>> readers;
  for (int r = 0; r < w; ++r) {
    readers.push_back(std::make_unique<MicroBatchReader>(plan, c.microbatches(), r));
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
      PT_ASSIGN_OR_RETURN(StageStart start, checkpoint::StageStartFrom(resume, plan, s));
      start.generation = options.generation;
      PT_ASSIGN_OR_RETURN(StageParts parts, BuildStage(c, plan, *readers[r], s, start, device));
      if (s == 0 && r == 0) parts.config.commands = options.commands.get();
      transports.push_back(transport::MakeInProcessTransport(hub, s, p, r, w));
      if (options.wrap_transport) {
        transports.back() = options.wrap_transport(std::move(transports.back()), s);
      }
      std::vector<std::pair<int, weights::WeightStore*>> model_stages;
      for (size_t k = 0; k < parts.weights.size(); ++k) {
        model_stages.emplace_back(parts.model_stages[k], parts.weights[k].get());
      }
      auto on_step = [&tracker, &sink, &c, model_stages, s, r](const executor::StepRecord& step) {
        if (r == 0 && (step.commands_after & control::kCheckpoint) &&
            !c.checkpoint().dir().empty()) {
          // A failed checkpoint costs only itself: the job goes on (the error is reported).
          for (const auto& [stage, weights] : model_stages) {
            if (absl::Status saved = sink.Deliver(step.step + 1, stage, *weights); !saved.ok()) {
              std::fprintf(stderr, "pipetrain: stage %d: checkpoint before step %lld failed: %s\n",
                           stage, static_cast<long long>(step.step + 1),
                           std::string(saved.message()).c_str());
            }
          }
        }
        if (step.mean_loss) tracker.LossKnown(step.step, *step.mean_loss);
        if (step.eval) tracker.EvalKnown(step.step, *step.eval);
        if (s == 0 && r == 0) tracker.StepEnded(step.step, step.end_s, step.grad_norm);
      };
      executors.push_back(std::make_unique<executor::StageExecutor>(
          parts.config, parts.weight_stores(), transports.back().get(), on_step));
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
  absl::Status stopped = StoppedStagesError(results, stopped_at);
  if (!stopped.ok() && options.on_failure) {
    std::vector<StoppedRank> ranks;
    for (int i = 0; i < n; ++i) {
      StoppedRank& rank = ranks.emplace_back();
      rank.state = executors[i]->commit_state();
      for (size_t k = 0; k < stages[i].weights.size(); ++k) {
        rank.model_stages.emplace_back(stages[i].model_stages[k], stages[i].weights[k].get());
      }
      rank.apply_held_update = [e = executors[i].get()] { return e->ApplyHeldUpdate(); };
    }
    options.on_failure(ranks);
  }
  PT_RETURN_IF_ERROR(stopped);

  const int64_t peak_memory = PeakResidentMemoryBytes();  // one process: shared by stages
  // One process: its stages share the CPU counter, or the GPU they all run on.
  // -1 (a GPU's, not known without a CUDA LibTorch) is reported as 0: not measured.
  const int64_t peak_tensors = std::max<int64_t>(0, memory::PeakTensorBytesOn(device));
  std::vector<StageOutcome> outcomes;
  for (int s = 0; s < n; ++s) {
    StageOutcome outcome;
    outcome.stats = executors[s]->stats();
    CopyNewestWeights(stages[s], outcome);
    outcome.parameter_bytes = stages[s].parameter_bytes;
    outcome.peak_memory_bytes = peak_memory;
    outcome.peak_tensor_bytes = peak_tensors;
    outcome.bytes_sent = transports[s]->bytes_sent();
    outcomes.push_back(std::move(outcome));
    PT_RETURN_IF_ERROR(SaveStageWeights(c, s, outcomes.back()));
  }
  PT_ASSIGN_OR_RETURN(JobReport report,
                      AssembleReport(c, plan, std::move(outcomes), tracker.Losses(),
                                     tracker.GradNorms(), tracker.Evals(), first_step, start_s));
  return report;
}

}  // namespace pipetrain::job
