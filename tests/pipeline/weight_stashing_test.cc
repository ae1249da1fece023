// PipeDream's weight stashing (schedule: pipedream) against an independent reference of its
// semantics (TrainReference: each stage's weight versions, micro-batch j on version
// max(0, floor((j − w_s)/m)) of stage s in its forward and backward alike, w_s the stage's
// warm-up; no schedule, no executor):
// - float64 parameters equal it (<= 1e-10) for p = 2 and 4, m = 1, 2 and 4, 1 and 2 replicas,
//   recomputation on and off; and they differ from 2BW's and 1F1B's (the staleness is
//   PipeDream's own);
// - the executor ran every F and B of micro-batch j on stage s on that version, and stage s
//   held p − s versions at once with m = 1;
// - a stop, and a job resumed from its checkpoint, end bitwise as the shorter or the
//   uninterrupted job, also with fewer micro-batches than stages.
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/control/step_commands.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

JobConfig PipeDreamGpt(int stages, int m, int replicas, const char* recompute) {
  JobConfig c = TinyGpt(ScheduleKind::kPipeDream, stages, m);
  c.model.n_layers = 3;  // 6 layers
  c.replicas = replicas;
  c.steps = 5;
  c.recompute = *ParseRecompute(recompute);
  return c;
}

TEST(PipeDream, EqualsItsWeightStashingReference) {
  for (const int p : {2, 4}) {
    for (const int m : {1, 2, 4}) {
      for (const int replicas : {1, 2}) {
        for (const char* recompute : {"none", "all"}) {
          SCOPED_TRACE(absl::StrCat("p=", p, " m=", m, " replicas ", replicas, " recompute ",
                                    recompute));
          const JobConfig c = PipeDreamGpt(p, m, replicas, recompute);
          const JobReport report = MustRun(c);
          const std::vector<at::Tensor> reference = MustReference(c);
          ASSERT_EQ(report.final_parameters.size(), reference.size());
          EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
        }
      }
    }
  }
  // Negative controls: the other rules' parameters are not these.
  const JobConfig c = PipeDreamGpt(4, 4, 1, "none");
  const std::vector<at::Tensor> pipedream = MustReference(c);
  for (const ScheduleKind other : {ScheduleKind::kTwoBW, ScheduleKind::kOneFOneB}) {
    JobConfig o = c;
    o.schedule = other;
    EXPECT_GT(MaxRelativeDifference(MustReference(o), pipedream), 1e-6)
        << schedule::ScheduleKindName(other);
  }
}

// Every F and B of micro-batch j on stage s ran on version max(0, floor((j − (p − s − 1))/m)):
// the updates stage s had made when j's forward began; with m = 1 stage s held p − s versions.
TEST(PipeDream, EachMicroBatchRunsOnTheVersionItsForwardFoundAndStageSHoldsPMinusS) {
  for (const int m : {1, 3}) {
    const int p = 4;
    JobConfig c = PipeDreamGpt(p, m, 1, "none");
    c.steps = 10;  // past the fill, stage 0 holds p versions
    const JobReport report = MustRun(c);
    for (int s = 0; s < p; ++s) {
      SCOPED_TRACE(absl::StrCat("m=", m, " stage ", s));
      const executor::StageStats& stats = report.stage_stats[s];
      int checked = 0;
      for (const executor::ActionRecord& r : stats.records) {
        if (r.action.kind != ActionKind::kForward && r.action.kind != ActionKind::kBackward) {
          continue;
        }
        const int64_t j = r.action.index, w = p - s - 1;
        EXPECT_EQ(r.version, j < w ? 0 : (j - w) / m) << schedule::ToString(r.action);
        ++checked;
      }
      EXPECT_EQ(checked, 2 * c.steps * m);
      if (m == 1) EXPECT_EQ(stats.peak_weight_versions, p - s);
    }
  }
}

// A stop before step 4, given before the run (m = 1 < p: stage 0 seals boundaries 4 updates
// ahead, the first ones when it starts): the result of a 4-step job, bit for bit.
TEST(PipeDream, AStopWithFewerMicroBatchesThanStagesEndsItAsAShorterJob) {
  JobConfig c = PipeDreamGpt(3, 1, 2, "none");
  c.steps = 8;
  RunOptions options;
  options.commands = std::make_shared<control::StepCommandQueue>(c.steps);
  ASSERT_TRUE(options.commands->Schedule(control::kStop, 4).ok());
  absl::StatusOr<JobReport> stopped = RunInProcess(c, options);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  JobConfig four = c;
  four.steps = 4;
  EXPECT_EQ(stopped->losses.size(), 4u);
  EXPECT_TRUE(BitwiseEqual(stopped->final_parameters, MustRun(four).final_parameters));
}

// m below p: stage 0 seals a boundary 1 + ceil(p/m) updates ahead (m = 1, 2) or 2 (m = 4).
TEST(PipeDream, AJobResumedFromItsCheckpointEndsAsTheOneThatNeverStopped) {
  for (const int m : {1, 2, 4}) {
    SCOPED_TRACE(absl::StrCat("m=", m));
    const std::string dir = ::testing::TempDir() + "/pipedream_checkpoints";
    std::filesystem::remove_all(dir);
    JobConfig c = PipeDreamGpt(3, m, 2, "none");
    c.steps = 7;
    c.checkpoint.dir = dir;
    c.checkpoint.every = 3;  // boundaries 3 and 6
    const JobReport whole = MustRun(c);
    JobConfig resumed = c;
    resumed.resume_from = "latest";
    const JobReport rest = MustRun(resumed);
    EXPECT_EQ(rest.first_step, 6);
    EXPECT_TRUE(BitwiseEqual(rest.final_parameters, whole.final_parameters));
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
