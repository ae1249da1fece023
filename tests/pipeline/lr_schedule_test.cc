// Learning-rate schedules (optimizer.schedule, docs/design.md section 4.7a):
// - weights::LearningRateAt equals a table worked out by hand (warm-up, then cosine and
//   linear decay to min_lr, constant), and the run's report holds those rates per step;
// - float64 parameters equal the reference (<= 1e-10: torch.optim with each group's rate set
//   by LambdaLR's factor, written apart from the runtime's) under every schedule kind, each
//   meeting SGD with momentum and AdamW, cosine and linear decay, 1 and 2 replicas; negative
//   control: the constant-rate reference differs;
// - a job resumed from its checkpoint continues the schedule, under every kind: bitwise the
//   uninterrupted job;
// - every invalid field of a schedule is named in one error;
// - optimizer.lr 0 is a valid job whose weights stay bitwise the initial ones under every
//   kind (SGD with momentum and weight decay, AdamW with weight decay, in turn; negative
//   control: 1e-6 moves them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/model/model_zoo.h"
#include "runtime/model/stage_module.h"
#include "runtime/weights/optimizer_config.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

using weights::LrDecay;

JobSpec Scheduled(const ScheduleCase& k, const char* optimizer, LrDecay decay) {
  JobSpec c = TinyGpt(k, 4);
  c.set_steps(8);
  c.mutable_optimizer()->set_name(optimizer);
  c.mutable_optimizer()->set_lr(std::string(optimizer) == "sgd" ? 0.1 : 0.01);
  v1::LrScheduleSpec* schedule = c.mutable_optimizer()->mutable_schedule();
  schedule->set_warmup_steps(2);
  schedule->set_decay(std::string(weights::LrDecayName(decay)));
  schedule->set_decay_steps(4);
  schedule->set_min_lr(c.optimizer().lr() / 10);
  return c;
}

TEST(LearningRateSchedule, TheRatesAreTheFormulasWorkedOutByHand) {
  weights::OptimizerConfig o;
  o.lr = 0.1;
  o.schedule = {2, LrDecay::kCosine, 4, 0.01};
  // Warm-up 0.05, 0.1; cosine over steps 2..6 from 0.1 to 0.01: 0.01 + 0.09 (1 + cos(pi q))/2.
  const double cosine[] = {0.05,  0.1,
                           0.1,   0.01 + 0.09 * (1 + std::sqrt(0.5)) / 2,
                           0.055, 0.01 + 0.09 * (1 - std::sqrt(0.5)) / 2,
                           0.01,  0.01};
  for (int t = 0; t < 8; ++t) {
    EXPECT_NEAR(weights::LearningRateAt(o, t, 8), cosine[t], 1e-15) << "cosine, step " << t;
  }
  o.schedule.decay = LrDecay::kLinear;
  const double linear[] = {0.05, 0.1, 0.1, 0.0775, 0.055, 0.0325, 0.01, 0.01};
  for (int t = 0; t < 8; ++t) {
    EXPECT_NEAR(weights::LearningRateAt(o, t, 8), linear[t], 1e-15) << "linear, step " << t;
  }
  // decay_steps 0: the job's steps after the warm-up (here 6: 0.1 at step 2, 0.01 at 8).
  o.schedule.decay_steps = 0;
  EXPECT_NEAR(weights::LearningRateAt(o, 5, 8), 0.1 - 0.09 * 3 / 6, 1e-15);
  o.schedule.decay = LrDecay::kConstant;
  for (int t : {2, 7, 100}) EXPECT_EQ(weights::LearningRateAt(o, t, 8), 0.1);
  // No schedule: lr at every step.
  EXPECT_EQ(weights::LearningRateAt(weights::OptimizerConfig{"sgd", 0.3}, 0, 8), 0.3);
}

// The worked example of docs/design.md 4.7a and `run --help` (the peak used twice; the
// decay counted after the warm-up), and how Megatron-LM's and torchtitan's schedules are
// written in pipetrain's terms: each written here as its peer computes it, equal from the
// end of the warm-up on, and (the negative control) different during it.
TEST(LearningRateSchedule, TheWorkedExampleAndThePeersSchedulesInPipetrainsTerms) {
  weights::OptimizerConfig o;
  o.lr = 0.003;
  o.schedule = {/*warmup_steps=*/5, LrDecay::kCosine, /*decay_steps=*/0, /*min_lr=*/0};
  const double example[] = {0.0006, 0.0012,   0.0018,  0.0024,  0.003,
                            0.003,  0.002967, 0.00287, 0.002714};
  for (int t = 0; t < 9; ++t) {
    EXPECT_NEAR(weights::LearningRateAt(o, t, 20), example[t], 5e-7) << "step " << t;
  }
  // Megatron-LM (lr_warmup_iters W, lr_decay_iters D from step 0): update t uses
  // lr * t / W up to W, then the decay ratio (t - W) / (D - W).
  constexpr int kW = 5, kD = 20;
  const auto megatron = [&](int t) {
    if (t <= kW) return o.lr * t / kW;
    const double ratio = std::min(1.0, static_cast<double>(t - kW) / (kD - kW));
    return o.lr * 0.5 * (1 + std::cos(M_PI * ratio));
  };
  weights::OptimizerConfig as_megatron = o;
  as_megatron.schedule.decay_steps = kD - kW;
  for (int t = kW; t < 30; ++t) {
    EXPECT_NEAR(weights::LearningRateAt(as_megatron, t, 100), megatron(t), 1e-15) << t;
  }
  for (int t = 0; t < kW; ++t) {
    EXPECT_NE(weights::LearningRateAt(as_megatron, t, 100), megatron(t)) << t;
    EXPECT_NEAR(weights::LearningRateAt(as_megatron, t, 100), megatron(t + 1), 1e-15) << t;
  }
  // torchtitan (warmup_steps W, then linear to 0 over the steps after it): (t + 1) / (W + 1)
  // for t < W, then 1 - (t - W) / (steps - W).
  constexpr int kSteps = 20;
  const auto torchtitan = [&](int t) {
    if (t < kW) return o.lr * (t + 1) / (kW + 1);
    return o.lr * (1 - static_cast<double>(t - kW) / (kSteps - kW));
  };
  weights::OptimizerConfig as_torchtitan = o;
  as_torchtitan.schedule.decay = LrDecay::kLinear;
  for (int t = kW; t < kSteps; ++t) {
    EXPECT_NEAR(weights::LearningRateAt(as_torchtitan, t, kSteps), torchtitan(t), 1e-15) << t;
  }
  for (int t = 0; t < kW; ++t) {
    EXPECT_GT(weights::LearningRateAt(as_torchtitan, t, kSteps), torchtitan(t)) << t;
  }
}

TEST(LearningRateSchedule, EqualsTorchOptimWithLambdaLr) {
  const std::vector<ScheduleCase> kinds = EveryScheduleKind(3);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const ScheduleCase& k = kinds[i];
    const ScheduleKind kind = k.kind;
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (const LrDecay decay : {LrDecay::kCosine, LrDecay::kLinear}) {
        for (const int replicas : {1, 2}) {
          // Two of the eight a kind: SGD on one replica and AdamW on two, under one decay
          // and the other, the next kind with the decays swapped (every kind meets each
          // optimizer, decay and replica count; the sweep costs what a few kinds would).
          const bool adamw = std::string(optimizer) == "adamw";
          if (replicas != (adamw ? 2 : 1) ||
              (decay == LrDecay::kLinear) != ((i + adamw) % 2 == 1)) {
            continue;
          }
          SCOPED_TRACE(absl::StrCat(std::string(schedule::ScheduleKindName(kind)), " ", optimizer,
                                    " ", std::string(weights::LrDecayName(decay)), " replicas ",
                                    replicas));
          JobSpec c = Scheduled(k, optimizer, decay);
          c.set_replicas(replicas);
          const JobReport report = MustRun(c);
          const std::vector<at::Tensor> reference = MustReference(c);
          ASSERT_EQ(report.final_parameters.size(), reference.size());
          EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
          ASSERT_EQ(report.learning_rates.size(), 8u);
          for (int t = 0; t < 8; ++t) {
            EXPECT_EQ(report.learning_rates[t],
                      weights::LearningRateAt(OptimizerConfigOf(c), t, 8));
          }
          // Negative control: at a constant rate the reference is another.
          JobSpec constant = c;
          constant.mutable_optimizer()->clear_schedule();
          EXPECT_GT(MaxRelativeDifference(report.final_parameters, MustReference(constant)), 1e-6);
        }
      }
    }
  }
}

TEST(LearningRateSchedule, AResumedJobContinuesItBitwise) {
  for (const ScheduleCase& k : EveryScheduleKind(3)) {
    SCOPED_TRACE(std::string(schedule::ScheduleKindName(k.kind)));
    const std::string dir = ::testing::TempDir() + "/lr_schedule_checkpoints";
    std::filesystem::remove_all(dir);
    JobSpec c = Scheduled(k, "adamw", LrDecay::kCosine);
    c.mutable_checkpoint()->set_dir(dir);
    c.mutable_checkpoint()->set_every(3);
    const JobReport whole = MustRun(c);
    JobSpec resumed = c;
    resumed.set_resume_from(dir + "/" + checkpoint::StepDirName(6));  // latest: the final one
    const JobReport rest = MustRun(resumed);
    EXPECT_EQ(rest.first_step, 6);
    EXPECT_TRUE(BitwiseEqual(rest.final_parameters, whole.final_parameters));
    ASSERT_EQ(rest.learning_rates.size(), 2u);
    EXPECT_EQ(rest.learning_rates[0], whole.learning_rates[6]);
    std::filesystem::remove_all(dir);
  }
}

// lr 0 (frozen weights, a speed measurement, torch.optim accepts it): valid, and every
// update leaves every parameter as it was built, under decay and momentum too.
TEST(LearningRateSchedule, ZeroLeavesTheWeightsAsTheyWereBuilt) {
  const std::vector<ScheduleCase> kinds = EveryScheduleKind(3);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const ScheduleCase& k = kinds[i];
    const ScheduleKind kind = k.kind;
    for (const char* optimizer : {"sgd", "adamw"}) {
      if ((std::string(optimizer) == "adamw") != (i % 2 == 1)) continue;  // in turn
      SCOPED_TRACE(absl::StrCat(std::string(schedule::ScheduleKindName(kind)), " ", optimizer));
      JobSpec c = Scheduled(k, optimizer, LrDecay::kCosine);
      c.mutable_optimizer()->set_lr(0);
      c.mutable_optimizer()->mutable_schedule()->set_min_lr(0);
      c.mutable_optimizer()->set_weight_decay(0.1);
      c.mutable_optimizer()->set_momentum(std::string(optimizer) == "sgd" ? 0.9 : 0.0);
      ASSERT_TRUE(ValidateJob(c).ok()) << ValidateJob(c);
      absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
      ASSERT_TRUE(plan.ok()) << plan.status();
      absl::StatusOr<model::LayerList> layers = model::BuildModel(plan->model_config);
      ASSERT_TRUE(layers.ok()) << layers.status();
      const std::vector<at::Tensor> built = model::StageModule(0, *std::move(layers)).Parameters();
      const JobReport report = MustRun(c);
      EXPECT_TRUE(BitwiseEqual(report.final_parameters, built));
      for (double rate : report.learning_rates) EXPECT_EQ(rate, 0.0);
      EXPECT_TRUE(BitwiseEqual(MustReference(c), built));
      // Negative control: the smallest step moves them.
      JobSpec moving = c;
      moving.mutable_optimizer()->set_lr(1e-6);
      EXPECT_FALSE(BitwiseEqual(MustRun(moving).final_parameters, built));
    }
  }
}

TEST(LearningRateSchedule, EveryInvalidFieldIsNamedInOneError) {
  JobSpec c = Scheduled({ScheduleKind::kOneFOneB, 3, 0}, "sgd", LrDecay::kCosine);
  v1::LrScheduleSpec* schedule = c.mutable_optimizer()->mutable_schedule();
  schedule->set_warmup_steps(-1);
  schedule->set_decay("cosine");
  schedule->set_decay_steps(-2);
  schedule->set_min_lr(0.5);
  absl::StatusOr<JobReport> run = RunInProcess(c, {});
  ASSERT_FALSE(run.ok());
  const std::string message(run.status().message());
  for (const char* expected : {"optimizer.schedule.warmup_steps: must be >= 0, got -1",
                               "optimizer.schedule.decay_steps: must be >= 0, got -2",
                               "optimizer.schedule.min_lr: must be in [0, optimizer.lr = 0.1], "
                               "got 0.5"}) {
    EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
  }
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
