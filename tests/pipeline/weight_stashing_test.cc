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
//   uninterrupted job, also with fewer micro-batches than stages; switches, flushes and
//   checkpoints drain it and the result meets the reference with drains there;
// - vertical sync (vertical_sync: every stage runs j on stage 0's version v_0(j), its
//   reference the same rule) equals its reference for p = 2 and 4, m = 1 and 4, 1 and 2
//   replicas, recomputation on and off; without it run and reference are others (negative
//   control); the executor ran every F and B on v_0(j) and held the versions the planner
//   counts; resumed, it ends as uninterrupted;
//   another schedule refuses it.
#include <gtest/gtest.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/control/step_commands.h"
#include "runtime/model/model_zoo.h"
#include "runtime/planner/predict.h"
#include "runtime/weights/weight_store.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

JobSpec PipeDreamGpt(int stages, int m, int replicas, const char* recompute) {
  JobSpec c = TinyGpt(ScheduleKind::kPipeDream, stages, m);
  c.mutable_model()->set_n_layers(3);  // 6 layers
  c.set_replicas(replicas);
  c.set_steps(5);
  SetRecompute(c, *ParseRecompute(recompute));
  return c;
}

TEST(PipeDream, EqualsItsWeightStashingReference) {
  for (const int p : {2, 4}) {
    for (const int m : {1, 2, 4}) {
      for (const int replicas : {1, 2}) {
        for (const char* recompute : {"none", "all"}) {
          SCOPED_TRACE(
              absl::StrCat("p=", p, " m=", m, " replicas ", replicas, " recompute ", recompute));
          const JobSpec c = PipeDreamGpt(p, m, replicas, recompute);
          const JobReport report = MustRun(c);
          const std::vector<at::Tensor> reference = MustReference(c);
          ASSERT_EQ(report.final_parameters.size(), reference.size());
          EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
        }
      }
    }
  }
  // Negative controls: the other weight policies' parameters are not these (every kind of
  // another policy on this layout: those without chunks).
  const JobSpec c = PipeDreamGpt(4, 4, 1, "none");
  const std::vector<at::Tensor> pipedream = MustReference(c);
  for (const ScheduleKind other : schedule::kScheduleKinds) {
    if (schedule::WeightsOf(other) == schedule::WeightPolicy::kStashed ||
        schedule::HoldsChunks(other)) {
      continue;
    }
    JobSpec o = c;
    SetSchedule(o, other);
    EXPECT_GT(MaxRelativeDifference(MustReference(o), pipedream), 1e-6)
        << schedule::ScheduleKindName(other);
  }
}

// Every F and B of micro-batch j on stage s ran on version max(0, floor((j − (p − s − 1))/m)):
// the updates stage s had made when j's forward began; with m = 1 stage s held p − s versions.
TEST(PipeDream, EachMicroBatchRunsOnTheVersionItsForwardFoundAndStageSHoldsPMinusS) {
  for (const int m : {1, 3}) {
    const int p = 4;
    JobSpec c = PipeDreamGpt(p, m, 1, "none");
    c.set_steps(10);  // past the fill, stage 0 holds p versions
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
      EXPECT_EQ(checked, 2 * c.steps() * m);
      if (m == 1) {
        EXPECT_EQ(stats.peak_weight_versions, p - s);
      }
    }
  }
}

// A stop before step 4, given before the run (m = 1 < p: stage 0 seals boundaries 4 updates
// ahead, the first ones when it starts): the result of a 4-step job, bit for bit.
TEST(PipeDream, AStopWithFewerMicroBatchesThanStagesEndsItAsAShorterJob) {
  JobSpec c = PipeDreamGpt(3, 1, 2, "none");
  c.set_steps(8);
  RunOptions options;
  options.commands = std::make_shared<control::StepCommandQueue>(c.steps());
  ASSERT_TRUE(options.commands->Schedule(control::kStop, 4).ok());
  absl::StatusOr<JobReport> stopped = RunInProcess(c, options);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  JobSpec four = c;
  four.set_steps(4);
  EXPECT_EQ(stopped->losses.size(), 4u);
  EXPECT_TRUE(BitwiseEqual(stopped->final_parameters, MustRun(four).final_parameters));
}

// m below p: stage 0 seals a boundary 1 + ceil(p/m) updates ahead (m = 1, 2) or 2 (m = 4).
// Also under vertical sync.
TEST(PipeDream, AJobResumedFromItsCheckpointEndsAsTheOneThatNeverStopped) {
  for (const int m : {1, 2, 4}) {
    for (const bool vertical_sync : {false, true}) {
      SCOPED_TRACE(absl::StrCat("m=", m, vertical_sync ? " vertical sync" : ""));
      const std::string dir = ::testing::TempDir() + "/pipedream_checkpoints";
      std::filesystem::remove_all(dir);
      JobSpec c = PipeDreamGpt(3, m, 2, "none");
      c.set_vertical_sync(vertical_sync);
      c.set_steps(7);
      c.mutable_checkpoint()->set_dir(dir);
      c.mutable_checkpoint()->set_every(3);  // boundaries 3 and 6 (and the final one, after step 7)
      const JobReport whole = MustRun(c);
      JobSpec resumed = c;
      resumed.set_resume_from(dir + "/" + checkpoint::StepDirName(6));
      const JobReport rest = MustRun(resumed);
      EXPECT_EQ(rest.first_step, 6);
      EXPECT_TRUE(BitwiseEqual(rest.final_parameters, whole.final_parameters));
      std::filesystem::remove_all(dir);
    }
  }
}

// Every boundary command drains a pipedream pipeline, after which every stage starts on its
// newest version: switches before steps 3 and 4 and a flush before 6, or checkpoints every 3
// steps, meet the reference with drains there (within 1e-10), with and without vertical sync;
// the run without them misses it (negative control).
TEST(PipeDream, SwitchesFlushesAndCheckpointsDrainItAsItsReferenceSays) {
  for (const bool vertical_sync : {false, true}) {
    SCOPED_TRACE(vertical_sync ? "vertical sync" : "");
    JobSpec c = PipeDreamGpt(3, 2, 2, "none");
    c.set_vertical_sync(vertical_sync);
    c.set_steps(8);
    RunOptions options;
    options.commands = std::make_shared<control::StepCommandQueue>(c.steps());
    for (const auto& [command, step] : std::vector<std::pair<control::StepCommand, int64_t>>{
             {control::kSwitchVersion, 3}, {control::kSwitchVersion, 4}, {control::kFlush, 6}}) {
      ASSERT_TRUE(options.commands->Schedule(command, step).ok());
    }
    absl::StatusOr<JobReport> commanded = RunInProcess(c, options);
    ASSERT_TRUE(commanded.ok()) << commanded.status();
    absl::StatusOr<std::vector<at::Tensor>> drained = TrainReference(c, {3, 4, 6});
    ASSERT_TRUE(drained.ok()) << drained.status();
    EXPECT_LE(MaxRelativeDifference(commanded->final_parameters, *drained), 1e-10);
    EXPECT_GT(MaxRelativeDifference(MustRun(c).final_parameters, *drained), 1e-6);

    const std::string dir = ::testing::TempDir() + "/pipedream_drains";
    std::filesystem::remove_all(dir);
    JobSpec checkpointed = c;
    checkpointed.mutable_checkpoint()->set_dir(dir);
    checkpointed.mutable_checkpoint()->set_every(3);
    absl::StatusOr<std::vector<at::Tensor>> at_checkpoints = TrainReference(c, {3, 6});
    ASSERT_TRUE(at_checkpoints.ok()) << at_checkpoints.status();
    EXPECT_LE(MaxRelativeDifference(MustRun(checkpointed).final_parameters, *at_checkpoints),
              1e-10);
    std::filesystem::remove_all(dir);
  }
}

// Vertical sync: v_0(j) = max(0, floor((j − (p − 1))/m)), stage 0's version, on every stage.
int64_t StageZeroVersion(int p, int m, int64_t j) { return j < p - 1 ? 0 : (j - (p - 1)) / m; }

TEST(PipeDreamVerticalSync, EqualsItsReferenceWhereEveryStageRunsOnStageZerosVersion) {
  for (const int p : {2, 4}) {
    for (const int m : {1, 4}) {
      for (const int replicas : {1, 2}) {
        for (const char* recompute : {"none", "all"}) {
          SCOPED_TRACE(
              absl::StrCat("p=", p, " m=", m, " replicas ", replicas, " recompute ", recompute));
          JobSpec c = PipeDreamGpt(p, m, replicas, recompute);
          c.set_vertical_sync(true);
          const JobReport report = MustRun(c);
          const std::vector<at::Tensor> reference = MustReference(c);
          ASSERT_EQ(report.final_parameters.size(), reference.size());
          EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
        }
      }
    }
  }
  // Negative control: without vertical sync the rule is another, and so are the parameters
  // (its run against this reference, and the two references).
  JobSpec c = PipeDreamGpt(4, 1, 1, "none");
  c.set_vertical_sync(true);
  const std::vector<at::Tensor> synced = MustReference(c);
  c.set_vertical_sync(false);
  EXPECT_GT(MaxRelativeDifference(MustRun(c).final_parameters, synced), 1e-6);
  EXPECT_GT(MaxRelativeDifference(MustReference(c), synced), 1e-6);
}

// The executor's records: every F and B of micro-batch j ran on v_0(j) on every stage, and
// each stage held at most the versions the planner counts (planner::WeightVersions: a stage
// after the first keeps stage 0's from the latest given to its newest, 2 + ceil((p − 1)/m)).
TEST(PipeDreamVerticalSync, EveryStageRanEachMicroBatchOnTheVersionStageZeroRanItOn) {
  for (const int m : {1, 3}) {
    const int p = 4;
    JobSpec c = PipeDreamGpt(p, m, 1, "none");
    c.set_vertical_sync(true);
    c.set_steps(10);
    const JobReport report = MustRun(c);
    for (int s = 0; s < p; ++s) {
      SCOPED_TRACE(absl::StrCat("m=", m, " stage ", s));
      const executor::StageStats& stats = report.stage_stats[s];
      int checked = 0;
      for (const executor::ActionRecord& r : stats.records) {
        if (r.action.kind != ActionKind::kForward && r.action.kind != ActionKind::kBackward) {
          continue;
        }
        EXPECT_EQ(r.version, StageZeroVersion(p, m, r.action.index))
            << schedule::ToString(r.action);
        ++checked;
      }
      EXPECT_EQ(checked, 2 * c.steps() * m);
      EXPECT_EQ(stats.peak_weight_versions,
                planner::WeightVersions(ScheduleKind::kPipeDream, p, s, m, /*vertical_sync=*/true));
    }
  }
}

// A store asked for a version it does not hold, or for a second version of one micro-batch,
// says so (Internal), as does a store whose versions are its own to choose.
TEST(PipeDreamVerticalSync, AStoreRefusesAVersionItDoesNotHoldOrDoesNotTake) {
  model::ModelConfig mlp;
  mlp.name = "mlp";
  const auto store = [&](bool versions_given) {
    absl::StatusOr<model::LayerList> layers = model::BuildModel(mlp);
    EXPECT_TRUE(layers.ok()) << layers.status();
    auto optimizer = weights::MakeOptimizer({"sgd", 0.1});
    EXPECT_TRUE(optimizer.ok()) << optimizer.status();
    auto made = weights::MakeStashedWeights(
        std::make_unique<model::StageModule>(0, *std::move(layers)), *std::move(optimizer),
        /*micro_batches=*/2, /*start_version=*/3, versions_given);
    EXPECT_TRUE(made.ok()) << made.status();
    return *std::move(made);
  };
  const auto refused = [](const absl::Status& s, const std::string& why) {
    EXPECT_TRUE(absl::IsInternal(s)) << s;
    EXPECT_NE(std::string(s.message()).find(why), std::string::npos) << s;
  };
  std::unique_ptr<weights::WeightStore> given = store(true);
  ASSERT_TRUE(given->RunOn(0, 3).ok());
  EXPECT_EQ(given->VersionFor(0), 3);
  refused(given->RunOn(0, 4), "micro-batch 0 runs on version 3, not 4");
  refused(given->RunOn(1, 2), "runs on version 2 but this stage holds 3 to 3 only");
  refused(store(false)->RunOn(0, 3), "runs every micro-batch on the version it chooses");
}

TEST(PipeDreamVerticalSync, AnyOtherScheduleRefusesIt) {
  JobSpec c = PipeDreamGpt(2, 2, 1, "none");
  c.set_vertical_sync(true);
  SetSchedule(c, ScheduleKind::kOneFOneB);
  absl::StatusOr<JobReport> run = RunInProcess(c, {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(std::string(run.status().message())
                .find("vertical_sync: only pipedream runs micro-batches on weight versions of "
                      "their own; schedule is 1f1b"),
            std::string::npos)
      << run.status();
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
