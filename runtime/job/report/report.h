// What a finished job reports: losses, timing against the simulator's ideal, per-stage
// memory and time, final parameters. Built the same way whether stages ran as threads or as
// processes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/job/plan.h"
#include "runtime/schedule/action.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::job {

struct StageReport {
  int stage = 0;  // the rank's place in the pipeline
  // The layers of the rank's model stages (one range, or v under a schedule with chunks).
  std::vector<model::LayerRange> layers;
  int peak_stashed_microbatches = 0;
  int peak_weight_versions = 0;
  double compute_s = 0;
  double wait_s = 0;
  double allreduce_s = 0;
  int64_t parameter_bytes = 0;  // one version of the stage's own parameters
  // The resident high-water mark of the process that ran the stage (VmHWM). With stages as
  // threads of one process, that one process's figure for every stage.
  int64_t peak_memory_bytes = 0;
  // The most tensor storage the process held at once (runtime/memory; 0 when not counted):
  // what the planner predicts. Shared by the stages of one process like the above.
  int64_t peak_tensor_bytes = 0;
  // Payload bytes of the activations, gradients and step commands the stage sent to its
  // neighbours (counted by the transport).
  int64_t bytes_sent = 0;
};

// One evaluation on held-out data (JobSpec::eval), before step `step`, on W(step): the mean
// over the replicas of their evaluated micro-batches' mean loss and accuracy.
struct EvalPoint {
  int64_t step = 0;
  double loss = 0;
  double accuracy = 0;
};

struct JobReport {
  std::string schedule;
  int stages = 0;
  int replicas = 1;
  int micro_batches = 0;
  int micro_batch_size = 0;
  int steps = 0;
  std::string model_summary;  // "gpt: 7 layers, 221k parameters"
  std::string data_summary;
  std::vector<model::LayerRange> partition;
  std::vector<double> losses;          // one per step run, mean over the step's micro-batches
  std::vector<double> learning_rates;  // the rate each of those steps' updates used
  // With clipping (the optimizer's threshold), each of those steps' gradient norm before
  // clipping; empty without.
  std::vector<double> grad_norms;
  std::vector<EvalPoint> evals;  // every evaluation the run made, in order
  int64_t first_step = 0;        // of losses[0]: a resumed job's checkpoint step
  std::optional<double> data_entropy;
  double step_time_s = 0;        // median over steps after the first
  double ideal_step_time_s = 0;  // simulator, fed with this run's measured compute times
  // With replicas, medians over steps after the first: how long gradient AllReduce ran past
  // the end of stage 0's last backward (the part not hidden behind computation), and the
  // slowest stage's AllReduce span (its first start to its last end in the step).
  double exposed_allreduce_s = 0;
  double allreduce_s = 0;
  double wall_s = 0;
  double samples_per_s = 0;  // rows (sequences or examples) per second after step 0
  double tokens_per_s = 0;   // target tokens per second after step 0 (token data)
  bool token_data = false;   // tokens_per_s is meaningful
  int threads_per_stage = 1;
  std::vector<StageReport> per_stage;
  std::optional<double> max_param_rel_diff;  // against the reference trainer (--reference)

  // For tests and tools: every stage's full measurements (index replica * stages + stage),
  // and the final parameters of the whole model in layer order (what a checkpoint would
  // hold).
  std::vector<executor::StageStats> stage_stats;
  std::vector<at::Tensor> final_parameters;
  std::vector<at::Tensor> final_buffers;
};

struct Progress {
  int64_t step = 0;  // 0-based, finished
  int64_t steps = 0;
  double loss = 0;
  std::optional<double> grad_norm;  // with clipping: before it
  double elapsed_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
};

// What one rank leaves behind.
struct StageOutcome {
  executor::StageStats stats;
  // The newest weights of the rank's model stages, detached copies, in model order
  // (CopyNewestWeights), and how many of them each model stage holds.
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
  std::vector<int> model_stages;
  std::vector<int> parameter_counts, buffer_counts;  // per model stage
  int64_t parameter_bytes = 0;                       // as in StageReport
  int64_t peak_memory_bytes = 0;  // measured when the stage ended, before the copies above
  int64_t peak_tensor_bytes = 0;  // likewise (0: tensor memory not counted in this process)
  int64_t bytes_sent = 0;         // as in StageReport
};

// The report of a finished run from every (replica, rank) outcome, replica-major; per-rank
// figures and weights are replica 0's (final_parameters in layer order whatever the ranks
// held). `losses`: every step's loss, the mean over replicas
// (ProgressTracker::Losses(); the stages keep only their recent steps), the first of them
// step `first_step` (a resumed run's checkpoint step); the learning rate of each is the
// schedule's (weights::LearningRateAt, what every optimizer used); `grad_norms` those
// steps' gradient norms (ProgressTracker::GradNorms(): empty without clipping); `evals`
// its evaluations (ProgressTracker::Evals()). `start_s` is when the stages started
// (MonotonicSeconds).
absl::StatusOr<JobReport> AssembleReport(const JobSpec& config, const JobPlan& plan,
                                         std::vector<StageOutcome> stages,
                                         std::vector<double> losses, std::vector<double> grad_norms,
                                         std::vector<EvalPoint> evals, int64_t first_step,
                                         double start_s);

// The whole model's weights from one replica's outcomes (`ranks`, index = rank): each
// model stage's parameters and buffers from the rank that held it (StageOutcome's
// model_stages and counts), in model (layer) order, appended to `parameters` and `buffers`.
// Moves the tensors out of `ranks`. Internal if the outcomes do not hold every model stage
// exactly once with as many tensors as their counts say.
absl::Status WeightsInModelOrder(absl::Span<StageOutcome> ranks,
                                 std::vector<at::Tensor>& parameters,
                                 std::vector<at::Tensor>& buffers);

// The error of a failed run: the root cause (the first error that is not another stage's
// abort) and where every stage stopped ("[stopped at: stage 0 RECV_GRAD5, ...]"). OK if
// every result is OK.
absl::Status StoppedStagesError(const std::vector<absl::Status>& results,
                                const std::vector<std::optional<schedule::Action>>& stopped_at);

std::vector<at::Tensor> DetachedCopies(const std::vector<at::Tensor>& tensors);
// Detached copies of the rank's newest parameters and buffers into `outcome` (its
// parameters, buffers, model_stages and counts).
void CopyNewestWeights(const StageParts& parts, StageOutcome& outcome);

// Emits Progress in step order once both the step's end (stage 0) and its loss (last
// stage) are known. Thread-safe.
class ProgressTracker {
 public:
  // `first_step`: the first step this run runs (a resumed job's checkpoint step).
  ProgressTracker(const JobSpec& config, const JobPlan& plan, double start_s,
                  std::function<void(const Progress&)> sink, int64_t first_step = 0);
  // `grad_norm`: the step's gradient norm (StepRecord::grad_norm: with clipping).
  void StepEnded(int64_t step, double end_s, std::optional<double> grad_norm = std::nullopt);
  // Called once per replica; the step's loss is the mean over replicas.
  void LossKnown(int64_t step, double loss);
  // The evaluation after step `step` (before step + 1), once per replica: the mean over them.
  void EvalKnown(int64_t step, const executor::EvalRecord& eval);
  // The loss of every step emitted so far, in step order (from first_step).
  std::vector<double> Losses() const;
  // Likewise their gradient norms (none without clipping).
  std::vector<double> GradNorms() const;
  // Every evaluation every replica reported, in step order.
  std::vector<EvalPoint> Evals() const;

 private:
  void Flush();  // REQUIRES: mu_ held
  mutable std::mutex mu_;
  int64_t steps_;
  double start_s_;
  int64_t rows_per_step_, tokens_per_row_;
  int replicas_;
  std::map<int64_t, int> loss_count_;
  std::function<void(const Progress&)> sink_;
  std::map<int64_t, double> ends_, losses_;             // of steps not yet emitted
  std::map<int64_t, double> grad_norms_;                // likewise
  std::map<int64_t, std::pair<int, EvalPoint>> evals_;  // by step: replicas so far, the sum
  double first_end_s_ = 0;                              // of the first step
  std::vector<double> emitted_losses_, emitted_grad_norms_;
  int64_t first_step_, next_;
};

}  // namespace pipetrain::job
