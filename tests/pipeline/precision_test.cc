// bfloat16 mixed precision (dtype: bfloat16) on the CPU against float32, on the default job's
// GPT (its model, data, optimizer, 4 stages, 300 steps), stages as threads:
//   - under 1F1B the loss of every step after the 50th is within 2% of float32's, every stage
//     sends half the bytes (counted by the transport; a few bytes of step commands aside),
//     and the weights stay float32;
//   - under PipeDream-2BW (the default job's schedule) the 1-step-stale update amplifies
//     rounding: the loss averaged over every 10 steps after the 50th stays within 4%.
#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "runtime/job/launch/in_process.h"

namespace pipetrain::job {
namespace {

using schedule::ScheduleKind;

JobReport MustRun(const JobSpec& c) {
  absl::StatusOr<JobReport> report = RunInProcess(c);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : JobReport{};
}

// The mean of losses[t-w+1 .. t].
double Window(const std::vector<double>& losses, size_t t, size_t w) {
  double sum = 0;
  for (size_t i = t + 1 - w; i <= t; ++i) sum += losses[i];
  return sum / static_cast<double>(w);
}

TEST(MixedPrecision, BFloat16FollowsFloat32WithHalfTheBytes) {
  JobSpec f32;  // the default job
  SetSchedule(f32, ScheduleKind::kOneFOneB);
  f32.set_threads_per_stage(1);
  JobSpec bf16 = f32;
  SetPrecision(bf16, Precision::kBFloat16);
  const JobReport a = MustRun(f32), b = MustRun(bf16);
  ASSERT_EQ(a.losses.size(), 300u);
  ASSERT_EQ(b.losses.size(), 300u);
  for (size_t t = 50; t < a.losses.size(); ++t) {
    EXPECT_LE(std::abs(b.losses[t] - a.losses[t]) / a.losses[t], 0.02) << "step " << t;
  }
  // It learned.
  EXPECT_LT(b.losses.back(), 0.5 * b.losses.front());
  ASSERT_EQ(a.per_stage.size(), 4u);
  ASSERT_EQ(b.per_stage.size(), 4u);
  for (size_t s = 0; s < a.per_stage.size(); ++s) {
    SCOPED_TRACE(s);
    EXPECT_GT(a.per_stage[s].bytes_sent, 1 << 20);
    // Half, but for the step commands (a few int64 per boundary, the same in both).
    EXPECT_NEAR(2.0 * b.per_stage[s].bytes_sent, a.per_stage[s].bytes_sent, 4096);
  }
  for (const at::Tensor& p : b.final_parameters) EXPECT_EQ(p.scalar_type(), at::kFloat);
}

TEST(MixedPrecision, TwoBWAveragedOverTenStepsStaysClose) {
  JobSpec f32;  // the default job: PipeDream-2BW
  f32.set_threads_per_stage(1);
  ASSERT_EQ(ScheduleOf(f32), ScheduleKind::kTwoBW);
  JobSpec bf16 = f32;
  SetPrecision(bf16, Precision::kBFloat16);
  const JobReport a = MustRun(f32), b = MustRun(bf16);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t t = 50; t < a.losses.size(); ++t) {
    const double x = Window(a.losses, t, 10), y = Window(b.losses, t, 10);
    EXPECT_LE(std::abs(y - x) / x, 0.04) << "steps " << t - 9 << ".." << t;
  }
}

}  // namespace
}  // namespace pipetrain::job
