// Data-parallel replicas of the pipeline (stages and replicas as threads) against the
// un-pipelined reference over the global batch, and Hippie's overlap of the gradient
// AllReduce with the last backward: its timing per stage and its identical parameters.
#include <gtest/gtest.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/schedule/schedule.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

// Data-parallel replicas of the pipeline (stages and replicas as threads): the parameters
// equal the un-pipelined run over the whole global batch, for every schedule.
TEST(DataParallel, ReplicasEqualTheReferenceOnTheGlobalBatch) {
  const std::vector<ScheduleCase> kinds = EveryScheduleKind(3);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const ScheduleCase& k = kinds[i];
    const ScheduleKind kind = k.kind;
    for (int replicas : {2, 3}) {
      if (replicas != 2 + static_cast<int>(i % 2)) continue;  // 2 and 3 in turn
      JobSpec c = TinyGpt(k, 4);
      c.set_replicas(replicas);
      JobReport report = MustRun(c);
      SCOPED_TRACE(::testing::Message() << schedule::ScheduleKindName(kind) << " w=" << replicas);
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, MustReference(c)), 1e-10);
      // The replicas did read different data: one replica alone trains to other weights.
      JobSpec one = c;
      one.set_replicas(1);
      EXPECT_GT(MaxRelativeDifference(MustReference(one), MustReference(c)), 1e-6);
      for (const auto& stage : report.per_stage) EXPECT_GT(stage.allreduce_s, 0.0);
    }
  }
}

// Hippie's communication schedule: stage 0 averages gradient buckets during its final
// backward, other stages right after their last backward. Same parameters as without
// overlap; every AllReduce starts after the backward that produces its gradients, and
// stages s > 0 start theirs before stage 0 ends its last backward.
// Every kind that overlaps so: one stage a rank, one weight version a micro-batch's backward
// reads from (not a stash of versions).
TEST(DataParallel, OverlappedAllReduceTimingAndIdenticalParameters) {
  for (const ScheduleKind kind : schedule::kScheduleKinds) {
    if (schedule::HoldsChunks(kind) ||
        schedule::WeightsOf(kind) == schedule::WeightPolicy::kStashed) {
      continue;
    }
    JobSpec c = TinyGpt(kind, 2, 4);
    c.mutable_model()->set_d_model(64);
    c.mutable_model()->set_n_heads(4);
    c.set_microbatch_size(8);
    c.mutable_data()->set_seq_len(64);
    c.set_steps(3);
    // Stage 0 holds all but the head, so its last backward lasts tens of milliseconds: the
    // wall-clock claims are about the schedule, not about how 4 stage threads share 2 cores.
    SetStageRanges(c, {{0, 5}, {5, 6}});
    c.set_replicas(2);
    c.set_bucket_kib(64);  // several buckets
    c.set_overlap_allreduce(false);
    JobReport off = MustRun(c);
    c.set_overlap_allreduce(true);
    JobReport on = MustRun(c);
    SCOPED_TRACE(schedule::ScheduleKindName(kind));
    EXPECT_TRUE(BitwiseEqual(off.final_parameters, on.final_parameters));

    const int m = c.microbatches();
    // Start and end of each stage's last backward of every step.
    auto last_backward = [&](const executor::StageStats& st, int64_t t) {
      for (auto it = st.records.rbegin(); it != st.records.rend(); ++it) {
        if (it->action.kind == ActionKind::kBackward && it->action.index == (t + 1) * m - 1) {
          return *it;
        }
      }
      ADD_FAILURE() << "no last backward for step " << t;
      return executor::ActionRecord{};
    };
    ASSERT_EQ(on.stage_stats.size(), static_cast<size_t>(PipelineStages(c) * c.replicas()));
    for (int r = 0; r < c.replicas(); ++r) {
      SCOPED_TRACE(absl::StrCat("replica ", r));
      const auto& stage0 = on.stage_stats[r * PipelineStages(c)];
      int buckets = 0;
      for (const auto& a : stage0.allreduces) {
        ASSERT_GE(a.bucket, 0);  // stage 0 reduces only in buckets
        const auto b = last_backward(stage0, a.step);
        EXPECT_GE(a.start_s, b.start_s);
        EXPECT_LE(a.start_s, b.end_s);
        ++buckets;
      }
      EXPECT_GT(buckets, c.steps());  // more than one bucket per step
      for (int s = 1; s < PipelineStages(c); ++s) {
        const auto& st = on.stage_stats[r * PipelineStages(c) + s];
        ASSERT_EQ(st.allreduces.size(), static_cast<size_t>(c.steps()));
        for (const auto& a : st.allreduces) {
          EXPECT_EQ(a.bucket, -1);
          EXPECT_GE(a.start_s, last_backward(st, a.step).end_s);
          // It starts within the stage's STEP that directly follows sending the gradient
          // of its last backward upstream, the gradient that stage 0's last backward needs...
          const auto& records = st.records;
          auto send = std::find_if(records.begin(), records.end(), [&](const auto& rec) {
            return rec.action == schedule::SendGrad((a.step + 1) * m - 1);
          });
          ASSERT_NE(send, records.end());
          ASSERT_NE(send + 1, records.end());
          EXPECT_EQ((send + 1)->action, schedule::Step(a.step));
          EXPECT_GE(a.start_s, (send + 1)->start_s);
          EXPECT_LE(a.end_s, (send + 1)->end_s);
          // ... and so, in wall-clock time, before stage 0 ends that backward: the
          // AllReduce of stage s overlaps the backward still running upstream.
          const double stage0_end = last_backward(stage0, a.step).end_s;
          EXPECT_LT(a.start_s, stage0_end) << "stage " << s << " step " << a.step << ": margin "
                                           << (stage0_end - a.start_s) * 1e3 << " ms";
        }
      }
      // Without overlap, stage 0 reduces once per step, after its last backward.
      const auto& off_stage0 = off.stage_stats[r * PipelineStages(c)];
      ASSERT_EQ(off_stage0.allreduces.size(), static_cast<size_t>(c.steps()));
      for (const auto& a : off_stage0.allreduces) {
        EXPECT_EQ(a.bucket, -1);
        EXPECT_GE(a.start_s, last_backward(off_stage0, a.step).end_s);
      }
    }
    // Every AllReduce starts before the latest end of stage 0's last backward, so the
    // exposed part can be no longer than the AllReduce itself.
    EXPECT_GT(on.allreduce_s, 0.0);
    EXPECT_LE(on.exposed_allreduce_s, on.allreduce_s);
  }
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
