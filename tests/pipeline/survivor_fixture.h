// The survivor-recovery tests' shared parts: the job (2 stages x 3 replicas, float64, AdamW,
// dropout, the step commit on), where its lost rank dies (DyingTransport: a fault point of a
// step, after which every call fails as a dead process's peers see), and the job on the
// survivors (2 replicas, the global batch kept). Each call runs on the calling thread.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/job/job_spec.h"
#include "runtime/schedule/chunked_schedule.h"
#include "tests/pipeline/forwarding_transport.h"
#include "tests/pipeline/schedule_cases.h"

namespace pipetrain::job::survivor_test {

namespace fs = std::filesystem;
using schedule::ScheduleKind;
using transport::MessageKind;

inline constexpr int kStages = 2, kReplicas = 3, kMicroBatches = 2, kSteps = 6;

// The job's micro-batches a step: kMicroBatches, or the fewest more that `kind` takes both
// there and on the survivors (3/2 as many: DualPipeV needs m >= 4 on 2 ranks); kMicroBatches
// where none up to 8 is taken (the caller's sweep then leaves the kind out).
inline int MicroBatchesFor(ScheduleKind kind) {
  for (int m = kMicroBatches; m <= 8; m += 2) {
    if (pipeline_test::TakesLayout(kind, kStages, 0, m) &&
        pipeline_test::TakesLayout(kind, kStages, 0, m * kReplicas / (kReplicas - 1))) {
      return m;
    }
  }
  return kMicroBatches;
}

inline JobSpec Job(ScheduleKind kind, const fs::path& dir) {
  JobSpec c;
  c.mutable_model()->set_name("gpt");
  c.mutable_model()->set_d_model(16);
  c.mutable_model()->set_n_heads(2);
  c.mutable_model()->set_n_layers(2);
  c.mutable_data()->set_vocab(16);
  c.mutable_data()->set_seq_len(8);
  c.mutable_data()->set_num_tokens(1 << 14);
  SetSchedule(c, kind);
  c.set_stages(kStages);
  c.set_replicas(kReplicas);
  c.set_microbatches(MicroBatchesFor(kind));
  c.set_microbatch_size(2);
  c.set_steps(kSteps);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("adamw");
  c.mutable_optimizer()->set_lr(1e-2);
  c.mutable_model()->set_dropout(0.1);  // masks follow their samples onto the survivors' layout
  SetPrecision(c, Precision::kFloat64);
  c.set_threads_per_stage(1);
  c.set_timeout_s(60);
  c.mutable_checkpoint()->set_dir(dir.string());  // where the survivors' state goes; no policy
  return c;
}

inline fs::path TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("pipetrain_survivors_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

// Where the lost rank dies, in step `step` (of the job's m micro-batches a step).
enum class Point {
  kForward,            // stage 0 sending the activation of the step's second micro-batch
  kBackward,           // stage 1 sending the gradient of the step's second micro-batch
  kGradientAllReduce,  // stage 1 entering the step's gradient AllReduce
  kCommitMessage,      // entering the step commit's barrier of its pipeline
  kAfterCommit,        // stage 0 sending the next step's second activation (the step applied)
};

struct Fault {
  Point point;
  int64_t step;
  int stage;
  // The step the survivors go on from is one of these: the step in progress when a place has
  // no survivor holding its final gradient, the next when every place does (a race at the
  // commit's end decides between them where both are listed).
  int64_t first_expected, last_expected;
};

// The rank's transport until it dies at its fault's point: from then on every call fails, as
// a dead process's peers see. `before_dying` and `after_dying` (optional) run on the dying
// thread before and after its peers learn of it.
class DyingTransport : public ForwardingTransport {
 public:
  DyingTransport(std::unique_ptr<transport::Transport> inner, const JobSpec& job, Fault fault,
                 std::function<void()> before_dying, std::function<void()> after_dying)
      : ForwardingTransport(std::move(inner)),
        layout_(schedule::LayoutOf(ScheduleParamsOf(job, job.steps()))),
        micro_batches_(job.microbatches()),
        fault_(fault),
        before_dying_(std::move(before_dying)),
        after_dying_(std::move(after_dying)) {}

  absl::Status SendMessage(int peer, MessageKind kind, int64_t number,
                           const at::Tensor& t) override {
    const int64_t j = layout_.MicroBatchOfMessage(number);
    const int64_t second = fault_.step * micro_batches_ + 1;
    if (dead_ ||
        (fault_.point == Point::kForward && kind == MessageKind::kActivation && j == second) ||
        (fault_.point == Point::kBackward && kind == MessageKind::kGradient && j == second) ||
        (fault_.point == Point::kAfterCommit && kind == MessageKind::kActivation &&
         j == second + micro_batches_)) {
      return Die();
    }
    return inner_->Send(peer, kind, number, t);
  }
  absl::StatusOr<at::Tensor> Recv(int peer, MessageKind kind, int64_t number,
                                  absl::Time deadline) override {
    if (dead_) return Die();
    return inner_->Recv(peer, kind, number, deadline);
  }
  absl::Status AllReduceMean(std::vector<at::Tensor>& tensors, absl::Time deadline) override {
    // The job is float64: the step's loss is one double, and every gradient (one bucket a
    // model stage: the model is small) is the rest; the step's first such reduction dies.
    const bool gradient = !tensors.empty() && tensors[0].scalar_type() == at::kDouble &&
                          !(tensors.size() == 1 && tensors[0].numel() == 1);
    if (dead_ || (fault_.point == Point::kGradientAllReduce && gradient &&
                  gradient_reductions_++ == fault_.step * layout_.chunks_per_rank)) {
      return Die();
    }
    return inner_->AllReduceMean(tensors, deadline);
  }
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const transport::Group& group,
                                                    const at::Tensor& mine,
                                                    absl::Time deadline) override {
    // The step commit's barrier of the pipeline: one int64 a rank, one a step.
    const bool commit = !group.replicas() && group.stages().empty() &&
                        mine.scalar_type() == at::kLong && mine.numel() == 1;
    if (dead_ ||
        (fault_.point == Point::kCommitMessage && commit && commit_barriers_++ == fault_.step)) {
      return Die();
    }
    return inner_->AllGather(group, mine, deadline);
  }

 private:
  // Every peer learns of it at once (as the executor would make them), then `after_dying`.
  absl::Status Die() {
    const absl::Status killed = absl::UnavailableError("the rank was killed");
    if (!dead_.exchange(true)) {
      if (before_dying_) before_dying_();
      inner_->Abort(killed);
      if (after_dying_) after_dying_();
    }
    return killed;
  }
  schedule::ChunkLayout layout_;
  int64_t micro_batches_;  // the job's, a step
  Fault fault_;
  std::function<void()> before_dying_, after_dying_;
  std::atomic<bool> dead_{false};
  int64_t gradient_reductions_ = 0;
  int64_t commit_barriers_ = 0;
};

// The suite's runs: with the step commit (what the host that may go on from survivors sets,
// job::Generation), on top of `options`.
inline RunOptions Committed(RunOptions options = {}) {
  options.generation.commit_steps = true;
  return options;
}

// The job on the survivors: 2 replicas of 3/2 as many micro-batches (the global batch kept),
// from the survivors' state.
inline JobSpec OnTheSurvivors(JobSpec c, int64_t step) {
  c.set_replicas(kReplicas - 1);
  c.set_microbatches(c.microbatches() * kReplicas / (kReplicas - 1));
  c.set_resume_from((fs::path(c.checkpoint().dir()) / checkpoint::StepDirName(step)).string());
  return c;
}

}  // namespace pipetrain::job::survivor_test
