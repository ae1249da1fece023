#include "runtime/schedule/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

constexpr double kTol = 1e-9;

std::vector<Action> Parse(const std::string& text) {
  absl::StatusOr<std::vector<Action>> list = ParseActions(text);
  EXPECT_TRUE(list.ok()) << list.status();
  return list.ok() ? *list : std::vector<Action>{};
}

std::string Name(const ScheduleParams& params) {
  return std::string(ScheduleKindName(params.kind)) + " p=" + std::to_string(params.stages) +
         " m=" + std::to_string(params.micro_batches) + " steps=" + std::to_string(params.steps);
}

// Every parameter combination of the proof obligation, for every kind whose ranks hold one
// stage (the chunked kinds have their own sweep, chunked_schedule_test.cc): p <= 8, m <= 16,
// one and two steps of a flushing kind, three of a continuous one (m >= its minimum).
std::vector<ScheduleParams> AllCases() {
  std::vector<ScheduleParams> cases;
  for (const ScheduleKind kind : kScheduleKinds) {
    if (HoldsChunks(kind)) continue;
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        if (RunsContinuously(kind)) {
          if (m >= TraitsOf(kind).micro_batches_per_rank * p) cases.push_back({kind, p, m, 3});
          continue;
        }
        for (int steps : {1, 2}) cases.push_back({kind, p, m, steps});
      }
    }
  }
  return cases;
}

struct OpTimes {
  double t_f, t_b;
};
constexpr OpTimes kOpTimes[] = {{1.0, 2.0}, {1.0, 1.0}, {0.25, 0.75}};

TEST(SimulatorSweepTest, EveryCaseIsValidAndDeadlockFree) {
  for (const ScheduleParams& params : AllCases()) {
    SCOPED_TRACE(Name(params));
    absl::StatusOr<std::vector<std::vector<Action>>> stages = BuildSchedule(params);
    ASSERT_TRUE(stages.ok()) << stages.status();
    const int p = params.stages;
    const int64_t total = static_cast<int64_t>(params.steps) * params.micro_batches;
    ASSERT_EQ(static_cast<int>(stages->size()), p);
    ASSERT_TRUE(CheckSchedule(*stages).ok()) << CheckSchedule(*stages);

    for (int s = 0; s < p; ++s) {
      // Every F and B exactly once per micro-batch, B after F; every STEP exactly once.
      std::map<int64_t, int> f_count, b_count, step_count;
      std::map<int64_t, size_t> f_pos, b_pos;
      const std::vector<Action>& list = (*stages)[s];
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        if (a.kind == ActionKind::kForward) ++f_count[a.index], f_pos[a.index] = i;
        if (a.kind == ActionKind::kBackward) ++b_count[a.index], b_pos[a.index] = i;
        if (a.kind == ActionKind::kOptimizerStep) ++step_count[a.index];
      }
      ASSERT_EQ(static_cast<int64_t>(f_count.size()), total);
      ASSERT_EQ(static_cast<int64_t>(b_count.size()), total);
      for (int64_t j = 0; j < total; ++j) {
        EXPECT_EQ(f_count[j], 1) << "s=" << s << " F" << j;
        EXPECT_EQ(b_count[j], 1) << "s=" << s << " B" << j;
        EXPECT_LT(f_pos[j], b_pos[j]) << "s=" << s << " j=" << j;
      }
      ASSERT_EQ(static_cast<int>(step_count.size()), params.steps);
      for (int t = 0; t < params.steps; ++t) EXPECT_EQ(step_count[t], 1);

      // Warm-up: forwards before the first backward.
      const bool continuous = RunsContinuously(params.kind);
      const int64_t warmup_horizon = continuous ? total : params.micro_batches;
      const auto first_b = std::find_if(list.begin(), list.end(), [](const Action& a) {
        return a.kind == ActionKind::kBackward;
      });
      const int64_t forwards_before = std::count_if(
          list.begin(), first_b, [](const Action& a) { return a.kind == ActionKind::kForward; });
      if (params.kind == ScheduleKind::kGPipe) {  // all forwards, then all backwards
        EXPECT_EQ(forwards_before, params.micro_batches);
      } else {
        // Warm-up of min(p-s-1, horizon) forwards, then the F of the first (F, B) pair if
        // there is one (OneFOneBWarmupIsMinOfPMinusSMinusOneAndM checks the full order).
        const int64_t warmup = std::min<int64_t>(p - s - 1, warmup_horizon);
        EXPECT_EQ(forwards_before, warmup + (warmup < warmup_horizon ? 1 : 0)) << "s=" << s;
      }
    }

    for (const OpTimes& op : kOpTimes) {
      SCOPED_TRACE(testing::Message() << "t_f=" << op.t_f << " t_b=" << op.t_b);
      absl::StatusOr<SimulationResult> sim = Simulate(*stages, CostModel::Uniform(op.t_f, op.t_b));
      ASSERT_TRUE(sim.ok()) << sim.status();
      const double unit = op.t_f + op.t_b;
      const int m = params.micro_batches;
      ASSERT_EQ(static_cast<int>(sim->peak_in_flight.size()), p);
      ASSERT_EQ(static_cast<int>(sim->busy_s.size()), p);
      ASSERT_EQ(static_cast<int>(sim->step_end_s.size()), p);
      for (int s = 0; s < p; ++s) {
        EXPECT_NEAR(sim->busy_s[s], total * unit, kTol);
        EXPECT_EQ(sim->peak_in_flight[s], PeakInFlight((*stages)[s]));
        // In flight: GPipe all m; a 1F1B of n micro-batches (n = m a step, or every step's
        // when continuous) min(p - s, n).
        const int64_t horizon = RunsContinuously(params.kind) ? total : m;
        const int64_t expected_in_flight =
            params.kind == ScheduleKind::kGPipe ? m : std::min<int64_t>(p - s, horizon);
        EXPECT_EQ(sim->peak_in_flight[s], expected_in_flight) << "s=" << s;
        ASSERT_EQ(static_cast<int>(sim->step_end_s[s].size()), params.steps);
        for (int t = 0; t < params.steps; ++t) EXPECT_GE(sim->step_end_s[s][t], 0.0);
      }
      if (RunsContinuously(params.kind)) {
        // Continuous 1F1B over steps*m micro-batches.
        EXPECT_NEAR(sim->makespan_s, (total + p - 1) * unit, kTol);
      } else {
        // A flushed step takes (m+p-1)(t_f+t_b), and steps do not overlap.
        EXPECT_NEAR(sim->makespan_s, params.steps * (m + p - 1) * unit, kTol);
        for (int t = 0; t < params.steps; ++t) {
          EXPECT_NEAR(sim->step_end_s[0][t], (t + 1) * (m + p - 1) * unit, kTol) << "t=" << t;
        }
      }
    }
  }
}

TEST(SimulatorSweepTest, OneFOneBWarmupIsMinOfPMinusSMinusOneAndM) {
  // The F immediately after warm-up is paired with B of the first micro-batch: count the
  // forwards before the first B minus that pair's F, when a pair exists.
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      for (int s = 0; s < p; ++s) {
        absl::StatusOr<std::vector<Action>> list =
            BuildStageSchedule({ScheduleKind::kOneFOneB, p, m, 1}, s);
        ASSERT_TRUE(list.ok());
        std::vector<Action> compute;
        for (const Action& a : *list) {
          if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) {
            compute.push_back(a);
          }
        }
        const int warmup = std::min(p - s - 1, m);
        // Expected F/B order: warm-up forwards, (F, B) pairs, remaining backwards.
        std::vector<Action> expected;
        for (int j = 0; j < warmup; ++j) expected.push_back(F(j));
        for (int i = 0; i < m - warmup; ++i) {
          expected.push_back(F(warmup + i));
          expected.push_back(B(i));
        }
        for (int j = m - warmup; j < m; ++j) expected.push_back(B(j));
        EXPECT_EQ(FormatActions(compute), FormatActions(expected))
            << "p=" << p << " m=" << m << " s=" << s;
      }
    }
  }
}

TEST(SimulatorSweepTest, TwoBWSteadyStateStepInterval) {
  for (const OpTimes& op : kOpTimes) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 16; ++m) {
        const ScheduleParams params{ScheduleKind::kTwoBW, p, m, 4};
        SCOPED_TRACE(Name(params));
        absl::StatusOr<std::vector<std::vector<Action>>> stages = BuildSchedule(params);
        ASSERT_TRUE(stages.ok());
        absl::StatusOr<SimulationResult> sim =
            Simulate(*stages, CostModel::Uniform(op.t_f, op.t_b));
        ASSERT_TRUE(sim.ok()) << sim.status();
        const double unit = op.t_f + op.t_b;
        const std::vector<double>& ends = sim->step_end_s[0];
        ASSERT_EQ(ends.size(), 4u);
        EXPECT_NEAR(ends[3] - ends[2], m * unit, kTol);
        EXPECT_NEAR(ends[2] - ends[1], m * unit, kTol);
        // Versus a flushed schedule, which needs (m+p-1) units per step.
        EXPECT_NEAR(ends[0], (m + p - 1) * unit, kTol);
      }
    }
  }
}

TEST(SimulatorTest, TimelineIsSequentialAndRespectsMessages) {
  const ScheduleParams params{ScheduleKind::kGPipe, 4, 6, 1};
  absl::StatusOr<std::vector<std::vector<Action>>> stages = BuildSchedule(params);
  ASSERT_TRUE(stages.ok());
  CostModel cost = CostModel::Uniform(1.0, 2.0);
  cost.link_latency_s = 0.5;
  absl::StatusOr<SimulationResult> sim = Simulate(*stages, cost);
  ASSERT_TRUE(sim.ok()) << sim.status();
  std::map<std::string, double> send_end;
  for (int s = 0; s < 4; ++s) {
    const auto& timeline = sim->timeline[s];
    ASSERT_EQ(timeline.size(), (*stages)[s].size());
    double prev_end = 0;
    for (size_t i = 0; i < timeline.size(); ++i) {
      EXPECT_EQ(timeline[i].action, (*stages)[s][i]);
      EXPECT_GE(timeline[i].start_s, prev_end);
      EXPECT_NEAR(timeline[i].end_s - timeline[i].start_s, cost.duration(s, timeline[i].action),
                  kTol);
      prev_end = timeline[i].end_s;
      const Action& a = timeline[i].action;
      if (a.kind == ActionKind::kSendActivation)
        send_end["A" + std::to_string(a.index) + ">" + std::to_string(s + 1)] = prev_end;
      if (a.kind == ActionKind::kSendGradient)
        send_end["G" + std::to_string(a.index) + ">" + std::to_string(s - 1)] = prev_end;
    }
  }
  for (int s = 0; s < 4; ++s) {
    for (const TimedAction& ta : sim->timeline[s]) {
      std::string key;
      if (ta.action.kind == ActionKind::kRecvActivation) key = "A";
      if (ta.action.kind == ActionKind::kRecvGradient) key = "G";
      if (key.empty()) continue;
      key += std::to_string(ta.action.index) + ">" + std::to_string(s);
      ASSERT_EQ(send_end.count(key), 1u) << key;
      EXPECT_GE(ta.start_s, send_end[key] + 0.5 - kTol) << key;
    }
  }
  // GPipe: latency lengthens the critical path by 2(p-1) hops of 0.5 each.
  EXPECT_NEAR(sim->makespan_s, (6 + 4 - 1) * 3.0 + 2 * 3 * 0.5, kTol);

  // 1F1B pays the latency on every round trip of its steady state, so at least as much.
  stages = BuildSchedule({ScheduleKind::kOneFOneB, 4, 6, 1});
  ASSERT_TRUE(stages.ok());
  sim = Simulate(*stages, cost);
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_GE(sim->makespan_s, (6 + 4 - 1) * 3.0 + 2 * 3 * 0.5 - kTol);
}

TEST(SimulatorTest, GoldenTimelineTwoStages) {
  // 1F1B p=2 m=2 with t_f=1, t_b=2, derived by hand: stage 1 runs F0 [1,2] B0 [2,4], gets
  // A1 (sent at 2) and runs F1 [4,5] B1 [5,7]; stage 0 runs B0 [4,6], waits for G1 until 7,
  // B1 [7,9]. Makespan (m+p-1)(t_f+t_b) = 9.
  const std::vector<std::vector<Action>> stages = {
      Parse("F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 RECV_GRAD1 B1 STEP0"),
      Parse("RECV_ACT0 F0 B0 SEND_GRAD0 RECV_ACT1 F1 B1 SEND_GRAD1 STEP0"),
  };
  absl::StatusOr<SimulationResult> sim = Simulate(stages, CostModel::Uniform(1.0, 2.0));
  ASSERT_TRUE(sim.ok()) << sim.status();
  auto spans = [](const std::vector<TimedAction>& timeline) {
    std::string out;
    for (const TimedAction& ta : timeline) {
      if (!out.empty()) out += " ";
      out += ToString(ta.action) + "[" + std::to_string(static_cast<int>(ta.start_s)) + "," +
             std::to_string(static_cast<int>(ta.end_s)) + "]";
    }
    return out;
  };
  EXPECT_EQ(spans(sim->timeline[0]),
            "F0[0,1] SEND_ACT0[1,1] F1[1,2] SEND_ACT1[2,2] RECV_GRAD0[4,4] B0[4,6] "
            "RECV_GRAD1[7,7] B1[7,9] STEP0[9,9]");
  EXPECT_EQ(spans(sim->timeline[1]),
            "RECV_ACT0[1,1] F0[1,2] B0[2,4] SEND_GRAD0[4,4] RECV_ACT1[4,4] F1[4,5] B1[5,7] "
            "SEND_GRAD1[7,7] STEP0[7,7]");
  EXPECT_DOUBLE_EQ(sim->makespan_s, 9.0);
  EXPECT_EQ(sim->peak_in_flight, (std::vector<int>{2, 1}));
  EXPECT_EQ(sim->busy_s, (std::vector<double>{6.0, 6.0}));
  EXPECT_EQ(sim->step_end_s, (std::vector<std::vector<double>>{{9.0}, {7.0}}));
}

TEST(SimulatorTest, FormatGridGolden) {
  absl::StatusOr<std::vector<std::vector<Action>>> stages =
      BuildSchedule({ScheduleKind::kGPipe, 2, 2, 1});
  ASSERT_TRUE(stages.ok());
  EXPECT_EQ(FormatGrid(*stages),
            "s0 | F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 RECV_GRAD1 B1 STEP0\n"
            "s1 | RECV_ACT0 F0 RECV_ACT1 F1 B0 SEND_GRAD0 B1 SEND_GRAD1 STEP0\n");
  EXPECT_EQ(FormatGrid({}), "");
  EXPECT_EQ(FormatGrid({{}, {F(0)}}), "s0 |\ns1 | F0\n");
  std::vector<std::vector<Action>> eleven(11, std::vector<Action>{F(0)});
  const std::string grid = FormatGrid(eleven);
  EXPECT_THAT(grid, HasSubstr("s0  | F0\n"));
  EXPECT_THAT(grid, HasSubstr("s10 | F0\n"));
}

TEST(SimulatorTest, PeakInFlight) {
  EXPECT_EQ(PeakInFlight({}), 0);
  EXPECT_EQ(PeakInFlight(Parse("F0 F1 B0 F2 B1 B2")), 2);
  EXPECT_EQ(PeakInFlight(Parse("F0 B0 F1 B1")), 1);
  EXPECT_EQ(PeakInFlight(Parse("RECV_ACT0 F0 SEND_ACT0 RECV_ACT1 F1 SEND_ACT1 F2 B0 B1 B2")), 3);
}

// Negative tests: the simulator is the oracle that rejects broken lists.

TEST(SimulatorNegativeTest, DeadlockBothStagesReceiveFirst) {
  const std::vector<std::vector<Action>> stages = {
      Parse("RECV_GRAD0 F0 SEND_ACT0 B0"),
      Parse("RECV_ACT0 F0 B0 SEND_GRAD0"),
  };
  ASSERT_TRUE(CheckSchedule(stages).ok()) << CheckSchedule(stages);
  absl::StatusOr<SimulationResult> sim = Simulate(stages, CostModel::Uniform(1, 2));
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(sim.status().message(), HasSubstr("deadlock"));
  EXPECT_THAT(sim.status().message(), HasSubstr("stage 0 waits at RECV_GRAD0"));
  EXPECT_THAT(sim.status().message(), HasSubstr("for stage 1"));
  EXPECT_THAT(sim.status().message(), HasSubstr("stage 1 waits at RECV_ACT0"));
  EXPECT_THAT(sim.status().message(), HasSubstr("for stage 0"));
}

TEST(SimulatorNegativeTest, DeadlockFromCrossedOrder) {
  // Stage 1 waits for micro-batch 1's activation, which stage 0 only sends after it got
  // B0's gradient, which stage 1 only sends after F1.
  const std::vector<std::vector<Action>> stages = {
      Parse("F0 SEND_ACT0 RECV_GRAD0 B0 F1 SEND_ACT1 RECV_GRAD1 B1"),
      Parse("RECV_ACT0 F0 RECV_ACT1 F1 B1 SEND_GRAD1 B0 SEND_GRAD0"),
  };
  ASSERT_TRUE(CheckSchedule(stages).ok());
  absl::StatusOr<SimulationResult> sim = Simulate(stages, CostModel::Uniform(1, 1));
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(sim.status().message(), HasSubstr("stage 0 waits at RECV_GRAD0"));
  EXPECT_THAT(sim.status().message(), HasSubstr("stage 1 waits at RECV_ACT1"));
}

TEST(SimulatorNegativeTest, UnmatchedSend) {
  const std::vector<std::vector<Action>> stages = {
      Parse("F0 SEND_ACT0 F1 SEND_ACT1 B0 B1"),
      Parse("RECV_ACT0 F0 F1 B0 B1"),
  };
  absl::Status status = CheckSchedule(stages);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "stage 0: SEND_ACT1 has no matching RECV_ACT1 on stage 1");
  EXPECT_EQ(Simulate(stages, CostModel::Uniform(1, 1)).status(), status);
}

TEST(SimulatorNegativeTest, UnmatchedRecvAndSendGrad) {
  absl::Status status = CheckSchedule({
      Parse("F0 RECV_GRAD0 B0"),
      Parse("F0 B0"),
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "stage 0: RECV_GRAD0 has no matching SEND_GRAD0 on stage 1");
  status = CheckSchedule({Parse("F0 B0"), Parse("F0 B0 SEND_GRAD0")});
  EXPECT_EQ(status.message(), "stage 1: SEND_GRAD0 has no matching RECV_GRAD0 on stage 0");
  status = CheckSchedule({Parse("F0 SEND_ACT0 B0")});
  EXPECT_EQ(status.message(), "stage 0: SEND_ACT0 on the last stage has no next stage");
  status = CheckSchedule({Parse("RECV_ACT0 F0 B0")});
  EXPECT_EQ(status.message(), "stage 0: RECV_ACT0 on the first stage has no previous stage");
}

TEST(SimulatorNegativeTest, DuplicateForward) {
  absl::Status status = CheckSchedule({Parse("F0 F1 F0 B0 B1")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "stage 0: duplicate F0 (actions 0 and 2)");
  status = CheckSchedule({Parse("F0 B0 STEP0 STEP0")});
  EXPECT_EQ(status.message(), "stage 0: duplicate STEP0 (actions 2 and 3)");
}

TEST(SimulatorNegativeTest, BackwardBeforeForward) {
  absl::Status status = CheckSchedule({Parse("B0 F0")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "stage 0: B0 (action 0) comes before any F0");
  status = CheckSchedule({Parse("F0 F1 B1")});
  EXPECT_EQ(status.message(), "stage 0: F0 (action 0) has no B0");
}

TEST(SimulatorNegativeTest, MicroBatchesDifferAcrossStages) {
  absl::Status status = CheckSchedule({Parse("F0 F1 B0 B1"), Parse("F0 B0")});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "stage 1: F1 missing (stage 0 has it)");
  status = CheckSchedule({Parse("F0 B0"), Parse("F0 F2 B0 B2")});
  EXPECT_EQ(status.message(), "stage 1: F2 is not a micro-batch of stage 0");
}

TEST(SimulatorNegativeTest, CommunicationOnTheWrongSideOfCompute) {
  EXPECT_EQ(CheckSchedule({Parse("SEND_ACT0 F0 B0"), Parse("RECV_ACT0 F0 B0")}).message(),
            "stage 0: SEND_ACT0 comes before F0");
  EXPECT_EQ(CheckSchedule({Parse("F0 SEND_ACT0 B0"), Parse("F0 RECV_ACT0 B0")}).message(),
            "stage 1: RECV_ACT0 comes after F0");
  EXPECT_EQ(CheckSchedule({Parse("F0 B0 RECV_GRAD0"), Parse("F0 B0 SEND_GRAD0")}).message(),
            "stage 0: RECV_GRAD0 comes after B0");
  EXPECT_EQ(CheckSchedule({Parse("F0 RECV_GRAD0 B0"), Parse("F0 SEND_GRAD0 B0")}).message(),
            "stage 1: SEND_GRAD0 comes before B0");
}

TEST(SimulatorNegativeTest, BadInputs) {
  EXPECT_EQ(CheckSchedule({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckSchedule({{F(-1), B(-1)}}).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::vector<Action>> ok = {Parse("F0 B0")};
  EXPECT_EQ(Simulate(ok, CostModel{}).status().code(), absl::StatusCode::kInvalidArgument);
  CostModel negative;
  negative.duration = [](int, const Action&) { return -1.0; };
  absl::StatusOr<SimulationResult> sim = Simulate(ok, negative);
  EXPECT_EQ(sim.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sim.status().message(), HasSubstr("F0 on stage 0"));
  CostModel latency = CostModel::Uniform(1, 1);
  latency.link_latency_s = -0.1;
  EXPECT_EQ(Simulate(ok, latency).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimulatorTest, HandWrittenListsWithoutCommunicationOrSteps) {
  // Communication and STEP are optional: single stage compute only.
  absl::StatusOr<SimulationResult> sim = Simulate({Parse("F0 F1 B1 B0")}, CostModel::Uniform(1, 3));
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_DOUBLE_EQ(sim->makespan_s, 8.0);
  EXPECT_EQ(sim->peak_in_flight, std::vector<int>{2});
  ASSERT_EQ(sim->step_end_s.size(), 1u);
  EXPECT_TRUE(sim->step_end_s[0].empty());
  // A missing STEP index reads -1.
  sim = Simulate({Parse("F0 B0 STEP2")}, CostModel::Uniform(1, 1));
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(sim->step_end_s[0], (std::vector<double>{-1.0, -1.0, 2.0}));
}

}  // namespace
}  // namespace pipetrain::schedule
