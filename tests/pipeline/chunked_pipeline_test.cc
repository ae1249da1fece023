// Schedules whose ranks hold several model stages (interleaved 1F1B, zero-bubble ZB-H1 and
// its interleaved form, ZB-V, DualPipeV) run by the executor, against independent
// references:
// - float64 parameters after 3 steps equal the un-pipelined trainer's (<= 1e-10) for every
//   schedule with p in {2, 4} ranks, v in {1, 2} chunks where the schedule allows it, 1 and 2
//   replicas, recomputation on and off; the parameters moved (negative control);
// - they equal 1F1B's over the same p x v model stages, one a rank, bit for bit: each stage
//   accumulates its micro-batches' gradients in the same order, whatever the schedule;
// - every W of a step is run by its update, and the executor's trace shows I and W;
// - a step command (a stop) reaches every rank of such a schedule at its boundary;
// - checkpoints written under one schedule resume under another layout.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/control/step_commands.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

struct ChunkedCase {
  ScheduleKind kind;
  int ranks, virtual_stages;
};

// A GPT deep enough for p x v model stages, m micro-batches that every schedule takes.
JobSpec ChunkedGpt(const ChunkedCase& k, int replicas, const char* recompute) {
  JobSpec c = TinyGpt(k.kind, k.ranks, k.ranks == 2 ? 4 : 8);
  c.set_virtual_stages(k.virtual_stages);
  c.mutable_model()->set_n_layers(k.ranks * k.virtual_stages);  // + embedding, final norm, head
  c.set_replicas(replicas);
  c.set_steps(3);
  SetRecompute(c, *ParseRecompute(recompute));
  return c;
}

std::string Name(const ChunkedCase& k) {
  return absl::StrCat(std::string(schedule::ScheduleKindName(k.kind)), "_p", k.ranks, "_v",
                      k.virtual_stages);
}

class ChunkedSchedules : public ::testing::TestWithParam<ChunkedCase> {};

TEST_P(ChunkedSchedules, EqualTheUnpipelinedRunAndOneFOneBBitwise) {
  const ChunkedCase k = GetParam();
  for (const int replicas : {1, 2}) {
    for (const char* recompute : {"none", "all"}) {
      SCOPED_TRACE(absl::StrCat(Name(k), " replicas ", replicas, " recompute ", recompute));
      const JobSpec c = ChunkedGpt(k, replicas, recompute);
      const JobReport report = MustRun(c);
      ASSERT_EQ(static_cast<int>(report.partition.size()), k.ranks * k.virtual_stages);
      const std::vector<at::Tensor> reference = MustReference(c);
      ASSERT_EQ(report.final_parameters.size(), reference.size());
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);

      // 1F1B with a rank for each of the same model stages.
      JobSpec flat = c;
      SetSchedule(flat, ScheduleKind::kOneFOneB);
      flat.set_virtual_stages(0);
      flat.set_stages(k.ranks * k.virtual_stages);
      const JobReport one_f_one_b = MustRun(flat);
      EXPECT_EQ(one_f_one_b.partition, report.partition);
      EXPECT_TRUE(BitwiseEqual(report.final_parameters, one_f_one_b.final_parameters));
      EXPECT_TRUE(BitwiseEqual(report.final_buffers, one_f_one_b.final_buffers));
      EXPECT_EQ(report.losses, one_f_one_b.losses);
    }
  }
  // The parameters moved: the comparison is not between two untouched initializations.
  JobSpec untouched = ChunkedGpt(k, 1, "none");
  untouched.mutable_optimizer()->set_lr(1e-12);
  EXPECT_GT(
      MaxRelativeDifference(MustReference(untouched), MustReference(ChunkedGpt(k, 1, "none"))),
      1e-3);
}

INSTANTIATE_TEST_SUITE_P(Schedules, ChunkedSchedules,
                         ::testing::Values(ChunkedCase{ScheduleKind::kInterleaved, 2, 2},
                                           ChunkedCase{ScheduleKind::kInterleaved, 4, 2},
                                           ChunkedCase{ScheduleKind::kZeroBubble, 2, 1},
                                           ChunkedCase{ScheduleKind::kZeroBubble, 4, 1},
                                           ChunkedCase{ScheduleKind::kZeroBubble, 2, 2},
                                           ChunkedCase{ScheduleKind::kZeroBubble, 4, 2},
                                           ChunkedCase{ScheduleKind::kZeroBubbleV, 2, 2},
                                           ChunkedCase{ScheduleKind::kZeroBubbleV, 4, 2},
                                           ChunkedCase{ScheduleKind::kDualPipeV, 2, 2},
                                           ChunkedCase{ScheduleKind::kDualPipeV, 4, 2}),
                         [](const ::testing::TestParamInfo<ChunkedCase>& info) {
                           return Name(info.param);
                         });

// The trace of a zero-bubble rank: every F, I and W of each of its stages, the W's after their
// I's, all before the step's update; and the stash of each stage empty at every update.
TEST(ChunkedSchedules, RanksRunEveryIAndWOfTheirStagesBeforeEachUpdate) {
  const JobSpec c = ChunkedGpt({ScheduleKind::kZeroBubbleV, 2, 2}, 1, "none");
  const JobReport report = MustRun(c);
  ASSERT_EQ(report.stage_stats.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const std::vector<int> stages = {r, 3 - r};  // the V
    std::map<std::pair<int, ActionKind>, int> counts;
    std::set<std::pair<int, int64_t>> inputs_done;
    for (const executor::ActionRecord& record : report.stage_stats[r].records) {
      const schedule::Action& a = record.action;
      if (a.kind == ActionKind::kOptimizerStep) {
        EXPECT_TRUE(inputs_done.empty()) << "rank " << r << " step " << a.index;
        continue;
      }
      if (!schedule::IsCompute(a.kind)) continue;
      EXPECT_TRUE(a.stage == stages[0] || a.stage == stages[1]) << schedule::ToString(a);
      ++counts[{a.stage, a.kind}];
      if (a.kind == ActionKind::kInputGradient) inputs_done.insert({a.stage, a.index});
      if (a.kind == ActionKind::kWeightGradient) {
        EXPECT_EQ(inputs_done.erase({a.stage, a.index}), 1u) << schedule::ToString(a);
      }
    }
    for (int s : stages) {
      EXPECT_EQ((counts[{s, ActionKind::kForward}]), c.steps() * c.microbatches());
      EXPECT_EQ((counts[{s, ActionKind::kInputGradient}]), c.steps() * c.microbatches());
      EXPECT_EQ((counts[{s, ActionKind::kWeightGradient}]), c.steps() * c.microbatches());
    }
  }
}

// A stop sent to rank 0 before step 2 ends every rank there: the result of a 2-step job.
TEST(ChunkedSchedules, AStopReachesEveryRankAtItsBoundary) {
  for (const ChunkedCase k : {ChunkedCase{ScheduleKind::kInterleaved, 2, 2},
                              ChunkedCase{ScheduleKind::kDualPipeV, 2, 2}}) {
    SCOPED_TRACE(Name(k));
    JobSpec c = ChunkedGpt(k, 2, "none");
    c.set_steps(6);
    RunOptions options;
    options.commands = std::make_shared<control::StepCommandQueue>(c.steps());
    ASSERT_TRUE(options.commands->Schedule(control::kStop, 2).ok());
    auto stopped = RunInProcess(c, options);
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    JobSpec two = c;
    two.set_steps(2);
    const JobReport expected = MustRun(two);
    EXPECT_EQ(stopped->losses.size(), 2u);
    EXPECT_TRUE(BitwiseEqual(stopped->final_parameters, expected.final_parameters));
  }
}

// Checkpoints by the policy under ZB-V, resumed under interleaved 1F1B on other ranks and
// under 1F1B: the same parameters as the job that never stopped (the checkpoint holds each
// layer once, whatever rank held it).
TEST(ChunkedSchedules, ACheckpointResumesUnderAnotherScheduleAndLayout) {
  const std::string dir = ::testing::TempDir() + "/chunked_checkpoints";
  std::filesystem::remove_all(dir);
  JobSpec c = ChunkedGpt({ScheduleKind::kZeroBubbleV, 2, 2}, 1, "none");
  c.set_steps(4);
  c.mutable_checkpoint()->set_dir(dir);
  c.mutable_checkpoint()->set_every(2);
  const JobReport whole = MustRun(c);
  ASSERT_TRUE(std::filesystem::exists(dir + "/latest"));
  for (const ChunkedCase resumed : {ChunkedCase{ScheduleKind::kInterleaved, 2, 2},
                                    ChunkedCase{ScheduleKind::kOneFOneB, 3, 0}}) {
    SCOPED_TRACE(Name(resumed));
    JobSpec r = c;
    SetSchedule(r, resumed.kind);
    r.set_stages(resumed.ranks);
    r.set_virtual_stages(resumed.virtual_stages);
    r.mutable_checkpoint()->set_every(0);
    r.set_resume_from(dir + "/" + checkpoint::StepDirName(2));  // latest: the final one
    const JobReport rest = MustRun(r);
    EXPECT_EQ(rest.first_step, 2);
    EXPECT_LE(MaxRelativeDifference(rest.final_parameters, whole.final_parameters), 1e-10);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
