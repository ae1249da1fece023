// Runs one pipeline rank's action list on the calling thread.
//
// A rank runs one model stage, or with a schedule whose ranks hold chunks (interleaved,
// zero-bubble, DualPipeV: schedule.h HoldsChunks) several, each with its own weights; an
// action names the stage it runs on. For each action of the schedule (runtime/schedule) it
// runs forward/backward on the weight version the stage's WeightStore assigns to the
// micro-batch, moves activations and gradients through the Transport (between two stages of
// one rank they are handed over in place), and applies the optimizer at STEP<t>.
// Zero-bubble's split backward: I<j> makes the stage's input gradient with every parameter's
// gradient queued (runtime/model/weight_gradients.h; the stages of a schedule that splits
// record the generic path in their forwards), W<j> runs them (on
// model stage 0 too, which has no input gradient to send: its I and W then divide its
// backward as the schedules assume). Every stage's W's are done by its STEP (checked).
// Under these schedules a RECV only posts the receive (the lowering places it early, where
// the peer's unit-cost turn put it): the F or backward that uses the tensor waits for it. The last
// stage computes the cross-entropy loss of each micro-batch against targets delivered to it, scaled
// by 1/m, so that gradients accumulated over the m micro-batches, then averaged across the w
// data-parallel replicas of the stage (Transport::AllReduceMean, before each update), are
// those of the global mini-batch mean.
// Tied weights (StageConfig::tied): before every update, after the replicas' averaging, the
// copies' gradients are summed on the ranks holding them, in an AllReduce among those ranks
// (Group::PipelineStages; in rank order, the same sum on each).
// Gradient clipping (StageConfig::clip_grad_norm): then the ranks of the pipeline sum the
// sums of squares of their parts of the gradient (a tie group counted on its first copy's
// rank only) in an AllReduce among the pipeline (in rank order: the same norm on every rank,
// bitwise), and each scales its gradient by min(1, C / (norm + 1e-6)), as
// torch.nn.utils.clip_grad_norm_ does for the whole model. A non-finite norm makes every
// rank skip the step (the non-finite-step rule). Under schedules without flushes (2BW,
// PipeDream) the exchange makes every stage's update wait for stage 0's, the last to finish
// the step's backward.
// Step commit (StageConfig::commit_steps, with replicas): once its gradient is final, a rank
// joins a barrier of its pipeline, then one of its replicas, and only then applies the
// update. So no rank has
// applied update t unless every rank of the job holds t's final gradient: after a fault the
// survivors agree on one step (commit_state(), ApplyHeldUpdate(),
// runtime/recovery/survivor_step.h).
// Evaluation (StageConfig::eval_every): at every boundary N that is a multiple of it, right
// after its update of mini-batch N − 1, every rank runs the evaluated micro-batches
// 0 .. eval_batches − 1 forward only (no autograd, nothing stashed, no version kept) through
// its model stages in model order, each on its newest weights W(N) in evaluation mode (no
// dropout; BatchNorm on its running statistics), receiving and sending their activations as
// kEvalActivation messages; the last model stage reports their mean loss and accuracy. No
// drain is needed: a rank's evaluation waits only on what other ranks do before their own
// update of mini-batch N − 1, and it changes no weight, statistic, random stream or message
// of training. The evaluation is flow-controlled so that no rank runs ahead of the ranks it
// feeds: each rank that took an evaluated micro-batch from another tells it so once it has
// run it (kEvalProgress), and a rank sends micro-batch k across a boundary only once the
// other side ran micro-batch k − kEvalWindow, and leaves the evaluation once it ran them
// all. So every wait of (and right after) an evaluation is for one or two micro-batches of
// a neighbour, however many are evaluated: an evaluation longer than timeout_s no longer
// makes the ranks upstream time out waiting for the next step's messages (they would have
// gone on to it while the last stage still evaluated). A wait that does time out says it
// waited for the evaluation.
// Messages between two ranks that exchange several stages' tensors are told apart by their
// index: micro-batch j across the boundary after model stage s travels as j·v + ⌊s/p⌋ (v
// chunks a rank; just j with one), the control message of step t as t·v (transport.h).
// Every received tensor is checked against the expected shape and dtype; a mismatch fails
// the stage with stage, micro-batch, expected and actual. Every receive has a deadline. On
// any error the transport is aborted so that all stages stop with the first error.
//
// Measured per stage: compute time of every action, time spent waiting in receives, peak
// stashed micro-batches (forward done, backward not yet), peak live weight versions
// (versions used by stashed micro-batches plus the newest), the version used by every F/B,
// and the gradient AllReduce time of every step.
//
// Step commands (runtime/control/step_commands.h): stage 0 seals boundary t+L right after its
// update of mini-batch t, L = 2, or 1 + ceil(p/m) for a schedule without flushes whose m is
// below p (and, with replicas, ORs what the stage-0 ranks sealed in a small AllReduce);
// every stage passes boundary t+1's commands to the next stage as a control message sent
// right after the activation of micro-batch (t+1)*m - 1 and received right after it. A stage
// that learns of commands rebuilds the rest of its action list from `schedule` (drain before
// the boundary; end there for a stop) and, for a switch, tells its weights. The StepRecord of
// mini-batch N-1 names the commands of boundary N. Defined in stage_executor.cc (the actions),
// gradient_averaging.cc (the replicas' AllReduce, tied copies' sums, clipping), step_boundaries.cc
// (sealing and applying step commands), evaluation.cc and step_commit.cc. Not thread-safe: one
// thread per StageExecutor.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/control/step_commands.h"
#include "runtime/model/weight_gradients.h"
#include "runtime/recovery/survivor_step.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/schedule/schedule.h"
#include "runtime/transport/transport.h"
#include "runtime/weights/weight_store.h"

namespace pipetrain::executor {

// Input ids/values of stage 0 or targets of the last stage, for a global micro-batch.
using MicroBatchTensorSource = std::function<absl::StatusOr<at::Tensor>(int64_t micro_batch)>;

struct ActionRecord {
  schedule::Action action;
  double start_s = 0;  // MonotonicSeconds()
  double end_s = 0;
  double wait_s = 0;     // part of [start, end) spent blocked in a receive
  int64_t version = -1;  // weight version used (F and B only)
  int64_t bytes = 0;     // tensor bytes sent or received (SEND_* and RECV_* only)
};

// How much of its past a stage keeps in StageStats: the most recent records of each kind.
// Totals, peaks and per-step callbacks are exact whatever the limits, so a stage's memory
// does not grow with the number of steps; reports and traces cover the kept window.
struct HistoryLimits {
  size_t actions = size_t{1} << 14;     // ActionRecord: 48 bytes (the default GPT job: 12,000)
  size_t steps = size_t{1} << 12;       // StepRecord: 80 bytes
  size_t allreduces = size_t{1} << 12;  // AllReduceRecord: 32 bytes
};

// A parameter several model stages use (tied weights: model::TiedParameters). Each rank
// that holds one or more of its members holds one copy (members on one rank share it:
// model::StageModule::ShareParameter). Before every update the copies' gradients (each
// averaged over its replicas first) are summed in copy order on every rank holding one, the
// ranks exchanging theirs, so every copy takes the same step and stays equal. A group whose
// members are all on one rank has one copy: one parameter, nothing to exchange.
struct TiedParameter {
  struct Copy {
    int rank = 0;  // in the pipeline
    // Where `rank` is this one: the model stage of the first member it holds (the owner) and
    // its index in that stage's OwnParameters(); -1 elsewhere.
    int stage = -1;
    int parameter = -1;
  };
  std::vector<Copy> copies;  // in the order of their first members
};

struct StageConfig {
  int stage = 0;          // the rank's place in its pipeline (its transport's stage), 0 .. p−1
  int num_stages = 1;     // p: the pipeline's ranks
  int micro_batches = 1;  // m: the loss of each micro-batch is scaled by 1/m
  int replicas = 1;       // w: gradients are averaged across replicas before each update
  // r: this rank's replica, 0 .. w − 1. Random layers draw for its micro-batch j = t·m + i
  // by its place in the job's sequence, t·(w·m) + r·m + i (model::LayerContext), so a
  // micro-batch's masks follow its samples onto any layout of the same global batch.
  int replica = 0;
  // Hippie: stage 0 averages its gradients bucket by bucket during the final backward of
  // each step, as each bucket's gradients become final (other stages average theirs right
  // after their last backward, which precedes stage 0's). Off: stage 0 waits for the end.
  bool overlap_allreduce = true;
  int64_t bucket_bytes = 4 << 20;
  // PipeDream's vertical sync (kPipeDream): each micro-batch's weight version follows its
  // activation, and a stage after the first runs it on that version (WeightStore::RunOn).
  bool vertical_sync = false;
  uint64_t seed = 0;
  // The stage runs schedule::StageActionStream(schedule, stage), regenerated when step
  // commands arrive.
  schedule::ScheduleParams schedule;
  // Stage 0 of replica 0: where the host puts step commands (may be null: none).
  control::StepCommandQueue* commands = nullptr;
  // A checkpoint at every boundary N that is a multiple of this (0: none), as if the command
  // had been scheduled there (every stage sees the same boundaries), and one after the last
  // step (StepRecord::commands_after).
  int64_t checkpoint_every = 0;
  // The pipeline's gradient is clipped to this 2-norm before each update (0: not clipped).
  double clip_grad_norm = 0;
  // Step commit (with replicas > 1; nothing with one): the rank applies the update of
  // mini-batch t only once every rank of every replica holds t's final gradient, so that the
  // survivors of a lost rank can agree on one step and go on from it (commit_state(),
  // runtime/recovery/survivor_step.h). After its gradient is final (averaged, tied copies
  // summed, clipped) the rank joins a barrier of its pipeline, then one of its replicas: that
  // completes only once every replica's pipeline has passed its own. Not with
  // vertical sync (PipeDream), whose checkpoints are not exact either.
  bool commit_steps = false;
  // Evaluate at every boundary that is a multiple of this (0: never), this many micro-batches
  // (keyed 0 .. eval_batches − 1) from eval_inputs and eval_targets.
  int64_t eval_every = 0;
  int eval_batches = 1;
  // Steps with a non-finite loss or gradient are skipped (WeightStore::Update); this many in
  // a row fail the stage, counting `skipped_in_a_row` steps right before the first (a run
  // that goes on after a restart). The step that reaches the limit is reported (on_step)
  // before the stage fails, so the steps the failure names are the steps reported skipped.
  int nonfinite_limit = 3;
  int skipped_in_a_row = 0;
  absl::Duration recv_timeout = absl::Seconds(120);
  MicroBatchTensorSource inputs;   // required on the rank of model stage 0
  MicroBatchTensorSource targets;  // required on the rank of the last model stage
  // The evaluated micro-batches' inputs (rank of model stage 0) and targets (last), by their
  // number k; required where eval_every > 0.
  MicroBatchTensorSource eval_inputs;
  MicroBatchTensorSource eval_targets;
  // What crosses each boundary of the model's stages: boundaries[s] is what model stage s
  // receives (boundaries[0] the data), boundaries[S] the last stage's output (S = p x v
  // stages). A received activation or gradient must have that shape and dtype.
  std::vector<transport::TensorSpec> boundaries;
  // Every tie group of the model (none: no tied weights).
  std::vector<TiedParameter> tied;
  HistoryLimits history;
  // Called on the stage's thread after every action that succeeded (metrics): it must not
  // block or take a lock another thread holds for long.
  std::function<void(const ActionRecord&)> on_action;
};

// One gradient AllReduce among replicas: a bucket launched during stage 0's final backward
// (bucket >= 0, started when its last gradient became final), or the whole gradient after
// the stage's last backward (bucket -1).
struct AllReduceRecord {
  int64_t step = 0;
  int bucket = -1;
  double start_s = 0;
  double end_s = 0;
};

// An evaluation's result, on the rank of the last model stage: over its micro-batches, the
// mean cross-entropy and the fraction of targets the output's argmax predicts.
struct EvalRecord {
  double loss = 0;
  double accuracy = 0;
};

struct StepRecord {
  int64_t step = 0;
  double end_s = 0;                 // when STEP<t> finished on this stage
  std::optional<double> mean_loss;  // last stage: mean unscaled loss over the m micro-batches
  double allreduce_s = 0;           // gradient AllReduce among replicas inside this step
  // When the computation of the step's last backward ended on this stage (before any wait
  // for an overlapped AllReduce).
  double last_backward_end_s = 0;
  // This stage's totals from its start to this step's update: time computing and time
  // waiting for peers (as in StageStats).
  double compute_s = 0;
  double wait_s = 0;
  // Step commands (control::StepCommand bits) that took effect at the boundary right after
  // this step, on this stage. After the job's last step: kCheckpoint where a checkpoint
  // policy is set (StageConfig::checkpoint_every), the job's final checkpoint.
  uint32_t commands_after = 0;
  // Its gradients were not finite: the update was skipped (weights and optimizer unchanged).
  bool skipped = false;
  // With clipping (StageConfig::clip_grad_norm): the 2-norm of the whole model's gradient
  // before clipping, the same on every rank; absent without clipping.
  std::optional<double> grad_norm;
  // With the step commit (StageConfig::commit_steps), on a rank of the last model stage: the
  // step's loss as the job reports it, the mean over the replicas of their mean_loss (they
  // average it right before the step's gradient); absent elsewhere.
  std::optional<double> job_loss;
  // The evaluation at the boundary right after this step (on W(step + 1)), on the rank of
  // the last model stage; absent elsewhere and at other boundaries.
  std::optional<EvalRecord> eval;
};

// What a stage is doing now, for heartbeats and hang diagnosis.
struct StageActivity {
  std::string action;       // "F3", "RECV_GRAD5"; "" before the first action and after the last
  std::string waiting_for;  // "stage 2" while blocked on that peer, "replicas" in a gradient
                            // AllReduce; "" when computing
  int stashed_microbatches = 0;  // forward done, backward not yet
  // Versions used by stashed micro-batches plus the newest (and under vertical sync those
  // kept for micro-batches to come: WeightStore::held_versions()).
  int live_weight_versions = 0;
};

struct StageStats {
  int peak_stashed_microbatches = 0;  // over the rank's stages together
  int peak_weight_versions = 0;
  double compute_s = 0;       // F, B, STEP and sends
  double wait_s = 0;          // blocked in receives
  double allreduce_s = 0;     // gradient AllReduce among replicas (part of compute_s)
  int64_t skipped_steps = 0;  // updates skipped for non-finite gradients
  // The most recent records, oldest first (StageConfig::history).
  std::deque<ActionRecord> records;
  std::deque<StepRecord> steps;
  std::deque<AllReduceRecord> allreduces;
};

class StageExecutor {
 public:
  // `weights`: those of each model stage the rank holds, in model order (one pointer unless
  // the schedule HoldsChunks). They and `transport` must outlive the executor. `on_step`
  // (optional) is called on this stage's thread after every STEP<t>.
  StageExecutor(StageConfig config, std::vector<weights::WeightStore*> weights,
                transport::Transport* transport,
                std::function<void(const StepRecord&)> on_step = nullptr);

  // Runs every action. Returns the first error (after aborting the transport).
  absl::Status Run();

  const StageStats& stats() const { return stats_; }
  // The action Run() failed or was aborted at; nullopt if it finished (or never ran).
  const std::optional<schedule::Action>& stopped_at() const { return stopped_at_; }
  // Thread-safe: may be called from any thread while Run() runs.
  StageActivity Activity() const;
  // Thread-safe: Run() fails with `reason` before its next action (or at its current wait:
  // the transport is aborted too), also on a stage that never waits for a peer.
  void Stop(const absl::Status& reason);

  // Where the rank's weights stand: the updates applied, and the final gradient of a step
  // whose commit began and did not end (StageConfig::commit_steps). Read once Run() has
  // returned, on the thread that ran it or after joining it.
  recovery::CommitState commit_state() const { return commit_; }
  // After Run() failed: applies the held update (commit_state().held_step), as every rank of
  // the job did or will, so that the rank stands at W(held_step + 1). FailedPrecondition if
  // none is held. Not thread-safe: once Run() has returned.
  absl::Status ApplyHeldUpdate();

 private:
  struct Stashed {
    at::Tensor input;   // what F<j> consumed (a leaf requiring grad on stages s > 0)
    at::Tensor output;  // stage output, or the scaled loss on the last stage
    int64_t version = 0;
  };
  // One model stage of this rank and what it holds between actions.
  struct Chunk {
    int stage = 0;  // in the model: 0 .. S−1
    weights::WeightStore* weights = nullptr;
    bool first = false, last = false;            // model stage 0, S−1
    std::map<int64_t, at::Tensor> activations;   // inputs received or handed over
    std::map<int64_t, int64_t> given_versions;   // vertical sync: received with them
    std::map<int64_t, at::Tensor> output_grads;  // output gradients received or handed over
    std::map<int64_t, Stashed> stash;            // forward done, backward (B or I) not yet
    std::map<int64_t, at::Tensor> input_grads;   // made by B or I, for SEND_GRAD
    // I's that owe their W: the deferred weight-gradient work of each micro-batch.
    std::map<int64_t, model::WeightGradientQueue> owed_w;
    // With replicas, under a schedule with chunks: the step's B's and W's done so far (its
    // gradient is final after m), and the AllReduce started then (when the rank's modules
    // share parameters: once every chunk's is final), waited for at STEP.
    int gradients_done = 0;
    std::unique_ptr<transport::Transport::PendingReduction> reduction;
    AllReduceRecord reduction_record;
  };

  // The chunk of model stage `stage` (kOwnStage: the rank's one).
  Chunk& ChunkOf(int stage);
  absl::Status Execute(const schedule::Action& action, ActionRecord& record);
  absl::Status Forward(Chunk& chunk, int64_t j, ActionRecord& record);
  // B<j> (full) or I<j> (input gradient, weight gradients deferred).
  absl::Status Backward(Chunk& chunk, int64_t j, schedule::ActionKind kind, ActionRecord& record);
  absl::Status WeightGradient(Chunk& chunk, int64_t j);
  // A B or W of micro-batch j finished on `chunk`: after the step's last, its gradient is
  // final and (schedules with chunks, replicas) its AllReduce starts, to overlap the rank's
  // other work until STEP.
  void GradientDone(Chunk& chunk, int64_t j);
  // Starts the AllReduce of `chunk`'s gradient of mini-batch t.
  void StartReduction(Chunk& chunk, int64_t t);
  // Shared parameters' gradients folded into their owners' on every chunk (before any is
  // read: the owner may be another chunk's).
  void FoldSharedGradients();
  // At the update of mini-batch t, before any stage's: `chunk`'s gradient averaged over its
  // replicas (done during the backward, started after it, or now), in place.
  absl::Status ReduceGradients(Chunk& chunk, int64_t t);
  // Then the gradients of tied copies (StageConfig::tied) this rank holds summed with the
  // other copies', exchanged with the ranks holding them.
  absl::Status SumTiedGradients(int64_t t, ActionRecord& record);
  // Then the 2-norm of the pipeline's whole gradient of mini-batch t (the ranks exchanging
  // their parts), and every chunk's gradient scaled by min(1, C / (norm + 1e-6)); filled with
  // NaN where the norm is not finite, so that every rank's update skips the step.
  absl::StatusOr<double> ClipGradients(int64_t t, ActionRecord& record);
  // The evaluation at boundary n (the file comment): its result on the rank of the last model
  // stage, nullopt on the others.
  absl::StatusOr<std::optional<EvalRecord>> Evaluate(int64_t n, ActionRecord& record);
  // How many evaluated micro-batches a rank may send across a boundary ahead of the rank
  // that runs them (the evaluation's flow control, above).
  static constexpr int64_t kEvalWindow = 2;
  // The final backward of a step on stage 0 with overlapped, bucketed AllReduce.
  absl::Status BackwardWithBucketedAllReduce(int64_t j, model::StageModule& module,
                                             const std::function<void()>& backward);
  // Receives micro-batch j's input (and the step commands it carries) or output gradient of
  // `chunk` into it.
  absl::Status ReceiveActivation(Chunk& chunk, int64_t j, ActionRecord& record);
  absl::Status ReceiveGradient(Chunk& chunk, int64_t j, ActionRecord& record);
  absl::StatusOr<at::Tensor> Receive(int peer_stage, transport::MessageKind kind, int64_t key,
                                     int64_t j, const transport::TensorSpec& expected,
                                     ActionRecord& record);
  // Runs `collective` (given a receive's deadline) among `group` as a wait: its time counts
  // in `record`, and Activity() names the group while it runs.
  absl::Status AwaitCollective(const transport::Group& group, ActionRecord& record,
                               absl::FunctionRef<absl::Status(absl::Time deadline)> collective);
  absl::Status Optimize(int64_t t, ActionRecord& record);
  // The step commit of mini-batch t (StageConfig::commit_steps), once its gradient is final.
  absl::Status CommitStep(int64_t t, ActionRecord& record);
  // With the step commit, on a rank of the last model stage (`chunk.last`), before the
  // replicas' AllReduce of mini-batch t's gradient starts: the step's loss averaged over the
  // replicas in an AllReduce of its own (not inside the gradient's: that would change how
  // Gloo's ring splits it), kept in job_losses_. Nothing elsewhere, or when already done.
  absl::Status ReduceStepLoss(const Chunk& chunk, int64_t t);
  // The index of micro-batch j's tensor crossing the boundary after model stage `lower`.
  int64_t MessageKey(int lower, int64_t j) const;
  void NoteLiveVersions();
  // The step commands of boundary n are known: apply them to the rest of the schedule.
  absl::Status ApplyBoundary(int64_t n, uint32_t commands);
  // Stage 0, after its update of mini-batch n − SealLead(): closes boundary n (see the file
  // comment).
  absl::Status SealBoundary(int64_t n);
  int64_t SealLead() const;
  // The commands the checkpoint policy puts at boundary n.
  uint32_t PolicyCommands(int64_t n) const;
  // Whether model stage s's output of micro-batch j carries the commands of a boundary of the
  // job as submitted downstream: j is the last of a mini-batch followed by a boundary, and
  // s + 1 < p (the first p stages are on ranks 0 .. p−1, whatever the placement).
  bool CarriesBoundary(int s, int64_t j) const;
  std::string Where(const schedule::Action& action) const;

  template <typename Record>
  static void Keep(std::deque<Record>& kept, const Record& record, size_t limit) {
    kept.push_back(record);
    while (kept.size() > limit) kept.pop_front();
  }

  StageConfig config_;
  schedule::ChunkLayout layout_;  // which rank holds which model stage
  // What runs, from config_.schedule plus the step commands applied (made by Run()).
  std::unique_ptr<schedule::StageActionStream> actions_;
  // Commands of boundaries not yet passed on by this stage.
  std::map<int64_t, uint32_t> boundary_commands_;
  at::Device device_ = at::kCPU;  // of the stage's parameters: where its small tensors go
  std::vector<Chunk> chunks_;     // model order
  transport::Transport* transport_;
  std::function<void(const StepRecord&)> on_step_;
  bool is_first_;  // the pipeline's first rank: it seals boundaries
  // Some module of the rank shares a parameter (tied members on this rank): gradients are
  // folded before they are read, its chunks' AllReduces start together, and stage 0 does
  // not average bucket by bucket during its backward.
  bool shares_parameters_ = false;

  // (model stage, index in its OwnParameters()) of the tied copies on this rank that the
  // gradient's norm does not count (every copy but a group's first).
  std::set<std::pair<int, int>> uncounted_copies_;
  std::map<int64_t, double> step_loss_sum_;
  double step_allreduce_s_ = 0;
  int consecutive_skips_ = 0;             // updates skipped in a row (non-finite gradients)
  recovery::CommitState commit_;          // updates applied, a final gradient held
  std::map<int64_t, double> job_losses_;  // ReduceStepLoss's, until the step's update
  double last_backward_end_s_ = 0;
  std::set<int64_t> reduced_steps_;  // steps whose gradient was averaged during backward
  // Gradient buckets (parameter indices, reverse order, about bucket_bytes each) and the
  // bucket of each parameter: fixed by the stage's parameter shapes, made on first use.
  std::vector<std::vector<int>> buckets_;
  std::vector<int> bucket_of_;
  StageStats stats_;
  std::optional<schedule::Action> stopped_at_;
  // Activity(): the running action as index * 8 + kind (-1: none), and what it waits for
  // (kNotWaiting, kWaitingForReplicas, or a peer stage).
  static constexpr int kNotWaiting = -1, kWaitingForReplicas = -2, kWaitingForPipeline = -3;
  std::atomic<int64_t> running_action_{-1};
  std::atomic<int> running_stage_{schedule::kOwnStage};
  std::atomic<bool> stop_requested_{false};
  std::atomic<int> stashed_now_{0}, live_versions_now_{0};
  absl::Mutex stop_mu_;
  absl::Status stop_reason_ ABSL_GUARDED_BY(stop_mu_);
  std::atomic<int> waiting_for_{kNotWaiting};
};

}  // namespace pipetrain::executor
