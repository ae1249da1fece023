// Evaluation on held-out data (eval: {every, batches, split}, docs/design.md section 4.7d),
// stages as threads, float64:
// - every evaluation's loss and accuracy equal the reference's (<= 1e-10: the un-pipelined
//   model of W(N) in evaluation mode on each replica's held-out micro-batches) under GPipe,
//   1F1B, 2BW, PipeDream and ZB-V, 4 stages (ZB-V: 2 x 2 chunks) x 2 replicas, a GPT with
//   dropout, and a CNN with BatchNorm (one replica: its running statistics are its own); negative
//   control: the reference one update earlier (under 2BW, the W(N - 1) that mini-batch N runs on)
//   differs;
// - training is the same with and without evaluation, bitwise: weights, BatchNorm running
//   statistics, every step's loss;
// - the held-out samples are never trained on (token data: one window between the two);
// - a split that leaves nothing to train on, or evaluation without a split, is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/pipeline/forwarding_transport.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

struct Case {
  ScheduleKind kind;
  int stages, virtual_stages;
  bool cnn;
};

JobSpec Evaluated(const Case& k) {
  JobSpec c = TinyGpt(k.kind, k.stages, 4);
  if (k.cnn) {
    c.clear_model();
    c.mutable_model()->set_name("cnn");
    c.mutable_model()->set_hidden(4);
    c.mutable_model()->set_hidden_layers(3);
    c.mutable_model()->clear_image_shape();
    for (int64_t d : {2, 6, 6}) c.mutable_model()->add_image_shape(d);
    c.mutable_model()->set_num_classes(5);
    c.clear_data();
    c.mutable_data()->set_kind("classification");
    c.mutable_data()->set_num_samples(512);
  } else {
    c.mutable_model()->set_dropout(0.25);  // off in evaluation, on in training
  }
  c.set_virtual_stages(k.virtual_stages);
  // With replicas each folds its own shard's BatchNorm statistics (docs/design.md 4.6), which
  // the one-model reference does not: the CNN runs one replica.
  c.set_replicas(k.cnn ? 1 : 2);
  c.set_steps(6);
  c.mutable_eval()->set_every(2);
  c.mutable_eval()->set_batches(2);
  c.mutable_eval()->set_split(0.25);
  return c;
}

std::string Name(const Case& k) {
  return absl::StrCat(std::string(schedule::ScheduleKindName(k.kind)), " p=", k.stages,
                      k.cnn ? " cnn" : " gpt");
}

TEST(Evaluation, EqualsTheReferenceModelOnTheHeldOutBatches) {
  for (const Case k :
       {Case{ScheduleKind::kGPipe, 4, 0, false}, Case{ScheduleKind::kOneFOneB, 4, 0, false},
        Case{ScheduleKind::kTwoBW, 4, 0, false}, Case{ScheduleKind::kPipeDream, 4, 0, false},
        Case{ScheduleKind::kZeroBubbleV, 2, 2, false}, Case{ScheduleKind::kGPipe, 4, 0, true},
        Case{ScheduleKind::kTwoBW, 2, 0, true}}) {
    SCOPED_TRACE(Name(k));
    const JobSpec c = Evaluated(k);
    const JobReport report = MustRun(c);
    // The reference evaluates after every update: its N-th is the run's, its (N-1)-th the
    // negative control.
    JobSpec every_step = c;
    every_step.mutable_eval()->set_every(1);
    std::vector<EvalPoint> reference;
    auto trained =
        TrainReference(every_step, {}, ReferenceClipping::kWholeModel, nullptr, &reference);
    ASSERT_TRUE(trained.ok()) << trained.status();
    EXPECT_LE(MaxRelativeDifference(report.final_parameters, *trained), 1e-10);
    ASSERT_EQ(reference.size(), 6u);
    ASSERT_EQ(report.evals.size(), 3u);
    for (const EvalPoint& e : report.evals) {
      SCOPED_TRACE(absl::StrCat("before step ", e.step));
      ASSERT_TRUE(e.step == 2 || e.step == 4 || e.step == 6);
      const EvalPoint& same = reference[static_cast<size_t>(e.step - 1)];
      const EvalPoint& earlier = reference[static_cast<size_t>(e.step - 2)];
      EXPECT_EQ(same.step, e.step);
      EXPECT_NEAR(e.loss, same.loss, 1e-10 * same.loss);
      EXPECT_NEAR(e.accuracy, same.accuracy, 1e-12);
      EXPECT_GE(e.accuracy, 0.0);
      EXPECT_LE(e.accuracy, 1.0);
      EXPECT_GT(std::abs(e.loss - earlier.loss), 1e-6 * same.loss);
    }
  }
}

// Stage 1's evaluation made slow: each evaluated activation it receives comes `delay` late.
class SlowEvaluation : public ForwardingTransport {
 public:
  SlowEvaluation(std::unique_ptr<transport::Transport> inner, absl::Duration delay)
      : ForwardingTransport(std::move(inner)), delay_(delay) {}
  absl::StatusOr<at::Tensor> Recv(int peer, transport::MessageKind kind, int64_t j,
                                  absl::Time deadline) override {
    absl::StatusOr<at::Tensor> got = inner_->Recv(peer, kind, j, deadline);
    if (kind == transport::MessageKind::kEvalActivation) absl::SleepFor(delay_);
    return got;
  }

 private:
  absl::Duration delay_;
};

RunOptions SlowLastStage(absl::Duration delay) {
  RunOptions options;
  options.wrap_transport = [delay](std::unique_ptr<transport::Transport> t, int stage) {
    if (stage != 1) return t;
    return std::unique_ptr<transport::Transport>(new SlowEvaluation(std::move(t), delay));
  };
  return options;
}

// An evaluation that takes longer than timeout_s (40 micro-batches of 100 ms on the last
// stage, 4 s, against 1.5 s): the ranks upstream wait for it (the evaluation's flow control)
// and the job succeeds with the same results as a fast one; it once failed blaming the last
// stage's lost connection, with the real cause (the first stage timed out) in parentheses.
// A single micro-batch longer than timeout_s still fails, and the error leads with what was
// waited for: the evaluation (the negative control: the slowness above is real).
TEST(Evaluation, LongerThanTimeoutIsWaitedForAndATimeoutNamesTheEvaluation) {
  JobSpec c = TinyGpt(ScheduleKind::kOneFOneB, 2, 4);
  c.set_steps(4);
  c.mutable_eval()->set_every(2);
  c.mutable_eval()->set_batches(40);
  c.mutable_eval()->set_split(0.25);
  c.set_timeout_s(1.5);
  const JobReport fast = MustRun(c);
  const auto start = absl::Now();
  absl::StatusOr<JobReport> slow = RunInProcess(c, SlowLastStage(absl::Milliseconds(100)));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_GT(absl::Now() - start, absl::Seconds(2 * 4)) << "the evaluations were slow";
  ASSERT_EQ(slow->evals.size(), 2u);
  ASSERT_EQ(fast.evals.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(slow->evals[i].loss, fast.evals[i].loss);
    EXPECT_EQ(slow->evals[i].accuracy, fast.evals[i].accuracy);
  }
  EXPECT_EQ(slow->losses, fast.losses);
  // One micro-batch over timeout_s.
  c.mutable_eval()->set_batches(3);
  absl::StatusOr<JobReport> failed = RunInProcess(c, SlowLastStage(absl::Seconds(2)));
  ASSERT_FALSE(failed.ok());
  const std::string message(failed.status().message());
  EXPECT_THAT(message, ::testing::HasSubstr("evaluation before step 2: model stage 1 (rank 1) "
                                            "did not run held-out micro-batch 0 of 3 within "
                                            "timeout_s (1.5s)"));
  const size_t lost = message.find(" lost ");
  EXPECT_TRUE(lost == std::string::npos || lost > message.find("evaluation before step"))
      << message;
}

TEST(Evaluation, LeavesTrainingBitwiseUnchanged) {
  for (const Case k :
       {Case{ScheduleKind::kOneFOneB, 4, 0, false}, Case{ScheduleKind::kTwoBW, 4, 0, false},
        Case{ScheduleKind::kPipeDream, 4, 0, false}, Case{ScheduleKind::kInterleaved, 2, 2, false},
        Case{ScheduleKind::kGPipe, 3, 0, true}}) {
    SCOPED_TRACE(Name(k));
    JobSpec c = Evaluated(k);
    c.mutable_eval()->set_every(1);
    const JobReport evaluated = MustRun(c);
    EXPECT_EQ(evaluated.evals.size(), 6u);
    c.mutable_eval()->set_every(0);  // the same split: the same training samples
    const JobReport plain = MustRun(c);
    EXPECT_TRUE(plain.evals.empty());
    EXPECT_TRUE(BitwiseEqual(evaluated.final_parameters, plain.final_parameters));
    EXPECT_TRUE(BitwiseEqual(evaluated.final_buffers, plain.final_buffers));
    EXPECT_EQ(evaluated.losses, plain.losses);
  }
}

TEST(Evaluation, TheHeldOutSamplesAreNeverTrainedOn) {
  for (const bool tokens : {true, false}) {
    SCOPED_TRACE(tokens ? "token data" : "classification");
    JobSpec c = Evaluated({ScheduleKind::kOneFOneB, 2, 0, !tokens});
    c.mutable_eval()->set_split(0.1);
    auto plan = MakeJobPlan(c);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t n = plan->dataset->num_samples();
    EXPECT_EQ(plan->held_out.begin + plan->held_out.count, n);
    EXPECT_EQ(plan->held_out.count, static_cast<int64_t>(0.1 * n));
    // Token windows overlap by one token: one window lies between training and held out.
    EXPECT_EQ(plan->held_out.begin - plan->train_samples, tokens ? 1 : 0);
    std::set<int64_t> trained;
    for (int64_t t = 0; t < 3 * n / plan->sampler->global_batch_size() + 1; ++t) {
      for (int64_t id : plan->sampler->GlobalBatchIds(t)) trained.insert(id);
    }
    // Every training sample, and no other.
    EXPECT_EQ(static_cast<int64_t>(trained.size()), plan->train_samples);
    EXPECT_LT(*trained.rbegin(), plan->train_samples);
  }
}

TEST(Evaluation, ASplitWithoutTrainingDataOrEvaluationWithoutASplitIsRefused) {
  JobSpec c = Evaluated({ScheduleKind::kOneFOneB, 2, 0, false});
  c.mutable_eval()->set_split(0);
  absl::StatusOr<JobReport> run = RunInProcess(c, {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("eval.split: must be > 0 when eval.every is set"),
            std::string::npos)
      << run.status();
  c = Evaluated({ScheduleKind::kOneFOneB, 2, 0, true});
  c.mutable_data()->set_num_samples(1);
  c.mutable_eval()->set_split(0.5);
  run = RunInProcess(c, {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("eval.split: holding out 1 of the data's 1 samples "
                                        "leaves none to train on"),
            std::string::npos)
      << run.status();
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
