// Schedules of several chunks a rank against golden lists written from the published rules
// (PyTorch's pipelining schedules, DeepSeek's dualpipev.py), and against the simulated
// bubbles and peak stashes those rules give with unit costs (F = I = W = 1, B = 2); every
// valid shape built deadlock-free, with and without its messages; the checkers' and the
// simulator's negative controls.
#include "runtime/schedule/chunked_schedule.h"

#include <algorithm>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "runtime/schedule/communication.h"
#include "runtime/schedule/compute_lists.h"
#include "runtime/schedule/schedule.h"
#include "runtime/schedule/simulator.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

// One step of `kind` on p ranks of v chunks, m micro-batches.
ScheduleParams Chunked(ScheduleKind kind, int p, int v, int m) {
  ScheduleParams params{kind, p, m};
  params.virtual_stages = v;
  return params;
}

std::string Lists(ScheduleKind kind, int p, int v, int m) {
  absl::StatusOr<std::vector<std::vector<Action>>> lists =
      BuildComputeLists(Chunked(kind, p, v, m));
  EXPECT_TRUE(lists.ok()) << lists.status();
  return lists.ok() ? FormatRankLists(*lists) : "";
}

TEST(ChunkedSchedule, GoldenListsForTwoRanksAndFourMicroBatches) {
  EXPECT_EQ(Lists(ScheduleKind::kInterleaved, 2, 2, 4),
            "r0: 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3\n"
            "r1: 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3\n");
  EXPECT_EQ(Lists(ScheduleKind::kZeroBubble, 2, 1, 4),
            "r0: 0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3\n"
            "r1: 1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3\n");
  EXPECT_EQ(Lists(ScheduleKind::kZeroBubbleV, 2, 2, 4),
            "r0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 "
            "3W3 0I2 0W2 0I3 0W3\n"
            "r1: 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 "
            "2I3 1I3 1W2 2W3 1W3\n");
  EXPECT_EQ(Lists(ScheduleKind::kDualPipeV, 2, 2, 4),
            "r0: 0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3\n"
            "r1: 1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3\n");
}

struct Expected {
  ScheduleKind kind;
  int v;
  double makespan;   // p = 4, m = 8
  int peak_live_r0;  // p = 4, m = 8
  double bubble;     // p = 8, m = 32
};

// What the rules give with unit costs, worked out independently of this code.
TEST(ChunkedSchedule, UnitCostBubblesAndStashesAsTheRulesGive) {
  const Expected expected[] = {
      {ScheduleKind::kInterleaved, 2, 57, 11, 0.099},
      {ScheduleKind::kInterleaved, 4, 105, 19, 0.052},
      {ScheduleKind::kZeroBubble, 1, 27, 4, 0.068},
      {ScheduleKind::kZeroBubble, 2, 51, 8, 0.035},
      {ScheduleKind::kZeroBubbleV, 2, 51, 8, 0.035},
      {ScheduleKind::kDualPipeV, 2, 51, 9, 0.035},
  };
  for (const Expected& e : expected) {
    SCOPED_TRACE(std::string(ScheduleKindName(e.kind)) + " v=" + std::to_string(e.v));
    const ScheduleParams small = Chunked(e.kind, 4, e.v, 8);
    absl::StatusOr<ComputeSimulation> sim =
        SimulateComputeLists(LayoutOf(small), 8, *BuildComputeLists(small));
    ASSERT_TRUE(sim.ok()) << sim.status();
    EXPECT_DOUBLE_EQ(sim->makespan, e.makespan);
    EXPECT_EQ(sim->peak_live[0], e.peak_live_r0);
    const ScheduleParams large = Chunked(e.kind, 8, e.v, 32);
    absl::StatusOr<ComputeSimulation> big =
        SimulateComputeLists(LayoutOf(large), 32, *BuildComputeLists(large));
    ASSERT_TRUE(big.ok()) << big.status();
    EXPECT_NEAR(big->bubble(), e.bubble, 0.0005);
  }
  // 1F1B, the baseline they improve on (the classic lists and simulator): 33, 27.3%; 17.9%.
  const auto one_f_one_b = [](int p, int m) {
    return *Simulate(*BuildSchedule({ScheduleKind::kOneFOneB, p, m, 1}), CostModel::Uniform(1, 2));
  };
  EXPECT_DOUBLE_EQ(one_f_one_b(4, 8).makespan_s, 33);
  EXPECT_NEAR(1 - 8 * 3.0 / 33, 0.273, 0.0005);
  EXPECT_NEAR(1 - 32 * 3.0 / one_f_one_b(8, 32).makespan_s, 0.179, 0.0005);
}

// Calls `check` for every valid shape of every kind that flushes (of the one list: gpipe,
// 1f1b and the kinds with chunks) with
// p <= max_p, v <= max_v, m <= max_m (under a trace naming it); returns how many.
int ForEachValidShape(int max_p, int max_v, int max_m,
                      const std::function<void(const ScheduleParams&)>& check) {
  int shapes = 0;
  for (const ScheduleKind kind : kScheduleKinds) {
    if (RunsContinuously(kind)) continue;  // no one-step list
    for (int p = 1; p <= max_p; ++p) {
      for (int v = 1; v <= max_v; ++v) {
        for (int m = 1; m <= max_m; ++m) {
          const ScheduleParams params = Chunked(kind, p, v, m);
          if (!ValidateScheduleParams(params).ok()) continue;
          SCOPED_TRACE(
              absl::StrCat(std::string(ScheduleKindName(kind)), " p=", p, " v=", v, " m=", m));
          check(params);
          ++shapes;
        }
      }
    }
  }
  return shapes;
}

TEST(ChunkedSchedule, EveryValidShapeIsCompleteAndDeadlockFree) {
  const int shapes = ForEachValidShape(5, 4, 12, [](const ScheduleParams& params) {
    absl::StatusOr<std::vector<std::vector<Action>>> lists = BuildComputeLists(params);
    ASSERT_TRUE(lists.ok()) << lists.status();
    absl::StatusOr<ComputeSimulation> sim =
        SimulateComputeLists(LayoutOf(params), params.micro_batches, *lists);
    ASSERT_TRUE(sim.ok()) << sim.status() << "\n" << FormatRankLists(*lists);
    if (params.kind != ScheduleKind::kZeroBubble) return;
    // Zero-bubble (v = 1 and interleaved): rank r owes at most r W's whenever it starts a
    // forward (the bound on what it keeps for them).
    for (int r = 0; r < params.stages; ++r) {
      int owed = 0, most = 0;
      for (const Action& a : (*lists)[r]) {
        if (a.kind == ActionKind::kForward) most = std::max(most, owed);
        owed += (a.kind == ActionKind::kInputGradient) - (a.kind == ActionKind::kWeightGradient);
      }
      EXPECT_LE(most, r) << "rank " << r;
    }
  });
  EXPECT_GT(shapes, 200);
}

TEST(ChunkedSchedule, PlacementsPutStagesOnTheirRanks) {
  const ChunkLayout loop{ChunkPlacement::kLoop, 4, 2};
  EXPECT_EQ(loop.RankOf(5), 1);
  EXPECT_EQ(loop.StagesOf(3), (std::vector<int>{3, 7}));
  const ChunkLayout v{ChunkPlacement::kV, 4, 2};
  EXPECT_EQ(v.RankOf(0), 0);
  EXPECT_EQ(v.RankOf(7), 0);
  EXPECT_EQ(v.RankOf(4), 3);
  EXPECT_EQ(v.StagesOf(1), (std::vector<int>{1, 6}));
}

TEST(ChunkedSchedule, EveryViolatedRuleIsNamed) {
  const std::string dual =
      std::string(ValidateScheduleParams(Chunked(ScheduleKind::kDualPipeV, 4, 3, 5)).message());
  EXPECT_THAT(dual, HasSubstr("dualpipev places 2 chunks on each rank (a V): virtual_stages must "
                              "be 2, got 3"));
  EXPECT_THAT(dual, HasSubstr("dualpipev needs microbatches >= 2 x stages: got m=5 < 2 x 4"));
  EXPECT_THAT(ValidateScheduleParams(Chunked(ScheduleKind::kInterleaved, 4, 1, 8)).message(),
              HasSubstr("interleaved needs virtual_stages >= 2"));
  EXPECT_THAT(ValidateScheduleParams(Chunked(ScheduleKind::kInterleaved, 4, 2, 9)).message(),
              HasSubstr("rounds of max(1, floor(m/p)) = 2: microbatches (9) must be a multiple"));
  EXPECT_TRUE(ValidateScheduleParams(Chunked(ScheduleKind::kZeroBubble, 4, 1, 9)).ok());
  const std::string zero =
      std::string(ValidateScheduleParams(Chunked(ScheduleKind::kZeroBubbleV, 0, 2, 0)).message());
  EXPECT_THAT(zero, HasSubstr("stages must be >= 1: got p=0"));
  EXPECT_THAT(zero, HasSubstr("micro_batches must be >= 1: got m=0"));
  EXPECT_FALSE(BuildComputeLists(Chunked(ScheduleKind::kDualPipeV, 2, 2, 3)).ok());
  // A kind that never flushes has no one-step lists to build, and says so.
  int continuous = 0;
  for (const ScheduleKind kind : kScheduleKinds) {
    if (!RunsContinuously(kind)) continue;
    ++continuous;
    const absl::Status built = BuildComputeLists(Chunked(kind, 2, 1, 4)).status();
    EXPECT_EQ(built.code(), absl::StatusCode::kInvalidArgument) << ScheduleKindName(kind);
    EXPECT_THAT(std::string(built.message()), HasSubstr("no one-step lists"));
  }
  EXPECT_EQ(continuous, 2);  // 2bw and pipedream
}

// The checker and the simulator can fail: lists broken on purpose.
TEST(ChunkedSchedule, BrokenListsAreRefusedAndADeadlockNamesTheWaits) {
  const ScheduleParams params = Chunked(ScheduleKind::kZeroBubble, 2, 1, 2);
  const ChunkLayout layout = LayoutOf(params);
  const std::vector<std::vector<Action>> good = *BuildComputeLists(params);
  ASSERT_TRUE(CheckComputeLists(layout, 2, good).ok());

  std::vector<std::vector<Action>> w_first = good;  // r1: 1F0 1I0 1F1 1I1 1W0 1W1
  std::swap(w_first[1][1], w_first[1][4]);
  EXPECT_THAT(CheckComputeLists(layout, 2, w_first).message(), HasSubstr("1W0 comes before its I"));

  std::vector<std::vector<Action>> wrong_rank = good;
  wrong_rank[0][0].stage = 1;
  EXPECT_THAT(CheckComputeLists(layout, 2, wrong_rank).message(),
              HasSubstr("rank 0: 1F0 names a stage rank 0 does not hold"));

  std::vector<std::vector<Action>> missing_w = good;
  missing_w[1].pop_back();
  EXPECT_THAT(CheckComputeLists(layout, 2, missing_w).message(), HasSubstr("1I1 has no W"));

  // Rank 0 wants stage 1's I0 before it runs F1; rank 1 runs F1 before I0.
  const std::vector<std::vector<Action>> crossed = {*ParseActions("0F0 0I0 0W0 0F1 0I1 0W1"),
                                                    *ParseActions("1F0 1F1 1I0 1W0 1I1 1W1")};
  absl::StatusOr<ComputeSimulation> stuck = SimulateComputeLists(layout, 2, crossed);
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stuck.status().message(),
              HasSubstr("deadlock: rank 0 waits at 0I0; rank 1 waits at 1F1"));
}

TEST(ChunkedSchedule, ActionsNameTheirStageInText) {
  EXPECT_EQ(ToString(OnStage(I(3), 12)), "12I3");
  EXPECT_EQ(ToString(W(0)), "W0");
  EXPECT_EQ(*ParseAction("2F0"), OnStage(F(0), 2));
  EXPECT_EQ(*ParseAction("B7"), B(7));
  EXPECT_NE(*ParseAction("0B7"), B(7));  // stage 0 is not "the list's own"
  EXPECT_THAT(ParseAction("02F0").status().message(), HasSubstr("leading zero in stage"));
  EXPECT_THAT(ParseAction("3").status().message(), HasSubstr("unknown action name ''"));
  // Lists of one stage per rank take no stage numbers and no split backward.
  EXPECT_THAT(CheckSchedule({{OnStage(F(0), 0), OnStage(B(0), 0)}}).message(),
              HasSubstr("0F0) is not one of a list of one stage per rank"));
  EXPECT_THAT(CheckSchedule({{F(0), I(0), W(0)}}).message(), HasSubstr("(I0) is not one of"));
}

// Messages placed right around the actions that use and make them, worked out by hand for
// ZB-H1, p = 2, m = 2; and for 1F1B on 3 ranks, m = 2, the placement every list of one stage
// a rank had before one lowering made them all.
TEST(ChunkedCommunication, GoldenListsWithTheirMessages) {
  const ScheduleParams params = Chunked(ScheduleKind::kZeroBubble, 2, 1, 2);
  absl::StatusOr<std::vector<std::vector<Action>>> lowered =
      AddCommunication(LayoutOf(params), 2, *BuildComputeLists(params));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(FormatRankLists(*lowered),
            "r0: 0F0 0SEND_ACT0 0F1 0SEND_ACT1 0RECV_GRAD0 0I0 0W0 0RECV_GRAD1 0I1 0W1\n"
            "r1: 1RECV_ACT0 1F0 1I0 1SEND_GRAD0 1RECV_ACT1 1F1 1I1 1SEND_GRAD1 1W0 1W1\n");
  const ScheduleParams one_f_one_b = Chunked(ScheduleKind::kOneFOneB, 3, 1, 2);
  lowered = AddCommunication(LayoutOf(one_f_one_b), 2, *BuildComputeLists(one_f_one_b));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ(FormatRankLists(*lowered),
            "r0: 0F0 0SEND_ACT0 0F1 0SEND_ACT1 0RECV_GRAD0 0B0 0RECV_GRAD1 0B1\n"
            "r1: 1RECV_ACT0 1F0 1SEND_ACT0 1RECV_ACT1 1F1 1SEND_ACT1 1RECV_GRAD0 1B0 1SEND_GRAD0 "
            "1RECV_GRAD1 1B1 1SEND_GRAD1\n"
            "r2: 2RECV_ACT0 2F0 2B0 2SEND_GRAD0 2RECV_ACT1 2F1 2B1 2SEND_GRAD1\n");
}

TEST(ChunkedCommunication, EveryValidShapeGetsEveryMessageOnceAndRunsToTheEnd) {
  const int shapes = ForEachValidShape(4, 3, 9, [](const ScheduleParams& params) {
    const int p = params.stages, m = params.micro_batches;
    const ChunkLayout layout = LayoutOf(params);
    const std::vector<std::vector<Action>> compute = *BuildComputeLists(params);
    absl::StatusOr<std::vector<std::vector<Action>>> lowered = AddCommunication(layout, m, compute);
    ASSERT_TRUE(lowered.ok()) << lowered.status();
    ASSERT_TRUE(CheckCommunication(layout, m, *lowered).ok())
        << CheckCommunication(layout, m, *lowered) << "\n"
        << FormatRankLists(*lowered);
    // The compute actions are the lists' own, in their order; a message only where
    // neighbouring stages sit on different ranks (none on one rank, none at the V's turn).
    int64_t messages = 0;
    for (int r = 0; r < p; ++r) {
      std::vector<Action> own;
      for (const Action& a : (*lowered)[r]) {
        IsCompute(a.kind) ? own.push_back(a) : void(++messages);
      }
      EXPECT_EQ(own, compute[r]);
    }
    int crossings = 0;
    for (int s = 0; s + 1 < layout.stages(); ++s) {
      crossings += layout.RankOf(s) != layout.RankOf(s + 1);
    }
    EXPECT_EQ(messages, 4 * crossings * m);  // activation and gradient, each sent and received
  });
  EXPECT_GT(shapes, 100);
}

// What a rank runs over several steps: step t is its one-step list with its messages, the
// micro-batches numbered from t·m, then STEP<t>; the stream the executor runs gives the same
// list action for action, and a stop rebases it there (as a shorter job's list).
TEST(ChunkedSchedule, EveryStepRepeatsTheOneStepListAndTheStreamGivesIt) {
  const int shapes = ForEachValidShape(3, 2, 6, [](ScheduleParams params) {
    const int m = params.micro_batches;
    const std::vector<std::vector<Action>> step =
        *AddCommunication(LayoutOf(params), m, *BuildComputeLists(params));
    params.steps = 3;
    for (int r = 0; r < params.stages; ++r) {
      std::vector<Action> expected;
      for (int64_t t = 0; t < 3; ++t) {
        for (Action a : step[r]) {
          a.index += t * m;
          if (!HoldsChunks(params.kind)) a.stage = kOwnStage;  // its rank's one stage
          expected.push_back(a);
        }
        expected.push_back(Step(t));
      }
      ASSERT_EQ(*BuildStageSchedule(params, r), expected) << "rank " << r;
      absl::StatusOr<StageActionStream> stream = StageActionStream::Create(params, r);
      ASSERT_TRUE(stream.ok()) << stream.status();
      std::vector<Action> streamed;
      // A stop before step 2 learned during step 1, as the executor learns it.
      const int64_t learned = static_cast<int64_t>(step[r].size()) + 2;
      for (; !stream->done(); stream->Advance()) {
        if (stream->position() == learned) {
          ScheduleParams stopped = params;
          stopped.steps = 2;
          absl::StatusOr<StageActionStream> rebased = stream->Rebase(stopped);
          ASSERT_TRUE(rebased.ok()) << rebased.status();
          *stream = *std::move(rebased);
        }
        streamed.push_back(stream->current());
      }
      expected.resize(2 * (step[r].size() + 1));
      EXPECT_EQ(streamed, expected) << "rank " << r;
    }
  });
  EXPECT_GT(shapes, 20);
}

TEST(ChunkedSchedule, AScheduleOfOneStageARankTakesNoVirtualStages) {
  ScheduleParams params{ScheduleKind::kOneFOneB, 4, 8};
  params.virtual_stages = 2;
  EXPECT_THAT(ValidateScheduleParams(params).message(),
              HasSubstr("1f1b holds one stage a rank: virtual_stages must be 1, got 2"));
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kInterleaved), 2);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kZeroBubble), 1);
  EXPECT_EQ(DefaultVirtualStages(ScheduleKind::kDualPipeV), 2);
  EXPECT_EQ(*ParseScheduleKind("ZBV"), ScheduleKind::kZeroBubbleV);
  EXPECT_EQ(*ParseScheduleKind("zbh1"), ScheduleKind::kZeroBubble);
  EXPECT_THAT(std::string(ParseScheduleKind("zb2p").status().message()),
              HasSubstr("interleaved, interleaved-1f1b, zb1p"));
}

// CheckCommunication can fail: messages missing, misplaced, and a pair that deadlocks.
TEST(ChunkedCommunication, BrokenMessagesAreRefusedAndADeadlockNamesTheWaits) {
  const ChunkLayout layout = LayoutOf(Chunked(ScheduleKind::kZeroBubble, 2, 1, 2));
  const auto lists = [](const char* r0, const char* r1) {
    return std::vector<std::vector<Action>>{*ParseActions(r0), *ParseActions(r1)};
  };
  const char* r0 = "0F0 0SEND_ACT0 0F1 0SEND_ACT1 0RECV_GRAD0 0I0 0W0 0RECV_GRAD1 0I1 0W1";
  const char* r1 = "1RECV_ACT0 1F0 1RECV_ACT1 1I0 1SEND_GRAD0 1F1 1I1 1SEND_GRAD1 1W0 1W1";
  EXPECT_TRUE(CheckCommunication(layout, 2, lists(r0, r1)).ok());
  EXPECT_THAT(
      CheckCommunication(layout, 2,
                         lists("0F0 0SEND_ACT0 0F1 0RECV_GRAD0 0I0 0W0 0RECV_GRAD1 0I1 0W1", r1))
          .message(),
      HasSubstr("rank 0: 0F1 is never sent (no 0SEND_ACT1)"));
  EXPECT_THAT(
      CheckCommunication(
          layout, 2,
          lists(r0, "1RECV_ACT0 1F0 1I0 1SEND_GRAD0 1F1 1RECV_ACT1 1I1 1SEND_GRAD1 1W0 1W1"))
          .message(),
      HasSubstr("rank 1: 1RECV_ACT1 comes after the action that uses it"));
  EXPECT_THAT(CheckCommunication(layout, 2,
                                 lists(r0,
                                       "1RECV_ACT0 1F0 1RECV_ACT1 1I0 1SEND_GRAD0 1F1 "
                                       "1RECV_ACT1 1I1 1SEND_GRAD1 1W0 1W1"))
                  .message(),
              HasSubstr("1RECV_ACT1 comes twice"));
  EXPECT_THAT(CheckCommunication(layout, 2,
                                 lists(r0,
                                       "1RECV_ACT0 1F0 1RECV_ACT1 1I0 1SEND_GRAD0 1F1 1I1 "
                                       "1SEND_GRAD1 1SEND_GRAD2 1W0 1W1"))
                  .message(),
              HasSubstr("rank 1: 1SEND_GRAD2 is outside micro-batches 0 .. 1"));
  EXPECT_THAT(CheckCommunication(layout, 2, lists(r0, "1RECV_ACT0 1F0 1RECV_ACT1 1I0 1SEND_GRAD0"))
                  .message(),
              HasSubstr("stage 1: 1I0 has no W"));  // the compute lists within, checked first
  // Rank 0 waits for gradient 0 before it sends activation 1; rank 1 the other way round.
  const absl::Status crossed = CheckCommunication(
      layout, 2,
      lists("0F0 0SEND_ACT0 0RECV_GRAD0 0F1 0SEND_ACT1 0I0 0W0 0RECV_GRAD1 0I1 0W1", r1));
  EXPECT_EQ(crossed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(crossed.message(), HasSubstr("deadlock: rank 0 waits at 0RECV_GRAD0; rank 1 "
                                           "waits at 1RECV_ACT1"));
  // Compute lists that deadlock cannot be given messages.
  EXPECT_EQ(AddCommunication(layout, 2, lists("0F0 0I0 0W0 0F1 0I1 0W1", "1F0 1F1 1I0 1W0 1I1 1W1"))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pipetrain::schedule
