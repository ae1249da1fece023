#include "runtime/schedule/schedule.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/schedule/simulator.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

std::vector<Action> Parse(const std::string& text) {
  absl::StatusOr<std::vector<Action>> list = ParseActions(text);
  EXPECT_TRUE(list.ok()) << list.status();
  return list.ok() ? *list : std::vector<Action>{};
}

std::vector<std::string> Formatted(const ScheduleParams& params) {
  absl::StatusOr<std::vector<std::vector<Action>>> stages = BuildSchedule(params);
  EXPECT_TRUE(stages.ok()) << stages.status();
  std::vector<std::string> out;
  if (stages.ok()) {
    for (const auto& list : *stages) out.push_back(FormatActions(list));
  }
  return out;
}

TEST(ScheduleKindTest, NamesAndAliases) {
  EXPECT_EQ(ScheduleKindName(ScheduleKind::kGPipe), "gpipe");
  EXPECT_EQ(ScheduleKindName(ScheduleKind::kOneFOneB), "1f1b");
  EXPECT_EQ(ScheduleKindName(ScheduleKind::kTwoBW), "2bw");
  const std::map<std::string, ScheduleKind> accepted = {
      {"gpipe", ScheduleKind::kGPipe},         {"GPipe", ScheduleKind::kGPipe},
      {"1f1b", ScheduleKind::kOneFOneB},       {"1F1B", ScheduleKind::kOneFOneB},
      {"flush", ScheduleKind::kOneFOneB},      {"PipeDream-Flush", ScheduleKind::kOneFOneB},
      {"2bw", ScheduleKind::kTwoBW},           {"2BW", ScheduleKind::kTwoBW},
      {"pipedream-2bw", ScheduleKind::kTwoBW}, {"last-stage", ScheduleKind::kOneFOneB},
      {"pipedream", ScheduleKind::kPipeDream}, {"weight-stashing", ScheduleKind::kPipeDream},
  };
  for (const auto& [name, kind] : accepted) {
    absl::StatusOr<ScheduleKind> parsed = ParseScheduleKind(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, kind) << name;
  }
  for (ScheduleKind kind : kScheduleKinds) {
    absl::StatusOr<ScheduleKind> parsed = ParseScheduleKind(ScheduleKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  absl::StatusOr<ScheduleKind> bad = ParseScheduleKind("zb-h1");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'zb-h1'"));
  for (const char* name :
       {"gpipe", "1f1b", "2bw", "flush", "pipedream-flush", "pipedream-2bw", "last-stage"}) {
    EXPECT_THAT(bad.status().message(), HasSubstr(name));
  }
}

// Hippie's last-stage schedule: the last stage runs each backward right after its forward
// (one micro-batch in flight); upstream stage s holds at most p-s, and exactly that many
// when m >= p.
TEST(ScheduleKindTest, LastStageScheduleHoldsOneMicroBatchOnTheLastStage) {
  absl::StatusOr<ScheduleKind> kind = ParseScheduleKind("last-stage");
  ASSERT_TRUE(kind.ok());
  for (int p : {2, 4}) {
    const int m = 6;
    absl::StatusOr<std::vector<std::vector<Action>>> all =
        BuildSchedule({*kind, p, m, /*steps=*/2});
    ASSERT_TRUE(all.ok()) << all.status();
    for (int s = 0; s < p; ++s) {
      int in_flight = 0, peak = 0;
      const std::vector<Action>& actions = (*all)[s];
      for (size_t i = 0; i < actions.size(); ++i) {
        if (actions[i].kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
        if (actions[i].kind == ActionKind::kBackward) --in_flight;
        if (s == p - 1 && actions[i].kind == ActionKind::kForward) {
          ASSERT_LT(i + 1, actions.size());
          EXPECT_EQ(actions[i + 1], B(actions[i].index)) << "p=" << p;
        }
      }
      EXPECT_EQ(in_flight, 0);
      EXPECT_EQ(peak, p - s) << "p=" << p << " stage " << s;
    }
  }
}

TEST(ValidateScheduleParamsTest, Valid) {
  EXPECT_TRUE(ValidateScheduleParams({}).ok());
  EXPECT_TRUE(ValidateScheduleParams({ScheduleKind::kTwoBW, 4, 4, 1}).ok());
  EXPECT_TRUE(ValidateScheduleParams({ScheduleKind::kGPipe, 8, 1, 3}).ok());
}

TEST(ValidateScheduleParamsTest, ListsAllViolations) {
  absl::Status status = ValidateScheduleParams({ScheduleKind::kOneFOneB, 0, 0, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "stages must be >= 1: got p=0; "
            "micro_batches must be >= 1: got m=0");

  status = ValidateScheduleParams({ScheduleKind::kGPipe, -1, 0, 0});
  EXPECT_EQ(status.message(),
            "stages must be >= 1: got p=-1; "
            "micro_batches must be >= 1: got m=0; "
            "steps must be >= 1: got steps=0");
}

TEST(ValidateScheduleParamsTest, TwoBWNeedsMAtLeastP) {
  absl::Status status = ValidateScheduleParams({ScheduleKind::kTwoBW, 4, 2, 1});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "2bw needs micro_batches >= stages: got m=2 < p=4");
  EXPECT_THAT(status.message(), HasSubstr("2"));
  EXPECT_THAT(status.message(), HasSubstr("4"));
  // Together with other violations.
  status = ValidateScheduleParams({ScheduleKind::kTwoBW, 3, 2, 0});
  EXPECT_EQ(status.message(),
            "steps must be >= 1: got steps=0; "
            "2bw needs micro_batches >= stages: got m=2 < p=3");
  // The same m < p is fine for the flush schedules.
  EXPECT_TRUE(ValidateScheduleParams({ScheduleKind::kOneFOneB, 4, 2, 1}).ok());
  EXPECT_TRUE(ValidateScheduleParams({ScheduleKind::kGPipe, 4, 2, 1}).ok());
}

TEST(BuildScheduleTest, RejectsBadParamsAndStage) {
  EXPECT_EQ(BuildSchedule({ScheduleKind::kTwoBW, 4, 2, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildStageSchedule({ScheduleKind::kGPipe, 0, 1, 1}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<Action>> out = BuildStageSchedule({ScheduleKind::kGPipe, 2, 1, 1}, 2);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(), HasSubstr("stage 2"));
  EXPECT_EQ(BuildStageSchedule({ScheduleKind::kGPipe, 2, 1, 1}, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BuildScheduleTest, BuildScheduleEqualsPerStageLists) {
  const ScheduleParams params{ScheduleKind::kOneFOneB, 5, 7, 2};
  absl::StatusOr<std::vector<std::vector<Action>>> all = BuildSchedule(params);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 5u);
  for (int s = 0; s < 5; ++s) {
    absl::StatusOr<std::vector<Action>> one = BuildStageSchedule(params, s);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(*one, (*all)[s]);
  }
}

// Golden lists, derived by hand from the contract in schedule.h.
TEST(GoldenTest, OneFOneBTwoStagesThreeMicroBatches) {
  EXPECT_EQ(Formatted({ScheduleKind::kOneFOneB, 2, 3, 1}),
            (std::vector<std::string>{
                "F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 F2 SEND_ACT2 RECV_GRAD1 B1 "
                "RECV_GRAD2 B2 STEP0",
                "RECV_ACT0 F0 B0 SEND_GRAD0 RECV_ACT1 F1 B1 SEND_GRAD1 RECV_ACT2 F2 B2 "
                "SEND_GRAD2 STEP0",
            }));
}

TEST(GoldenTest, OneFOneBThreeStagesTwoMicroBatchesTwoSteps) {
  // Stage 0 warm-up is min(2, 2) = 2: all forwards first. Each step is flushed.
  EXPECT_EQ(Formatted({ScheduleKind::kOneFOneB, 3, 2, 2}),
            (std::vector<std::string>{
                "F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 RECV_GRAD1 B1 STEP0 "
                "F2 SEND_ACT2 F3 SEND_ACT3 RECV_GRAD2 B2 RECV_GRAD3 B3 STEP1",
                "RECV_ACT0 F0 SEND_ACT0 RECV_ACT1 F1 SEND_ACT1 RECV_GRAD0 B0 SEND_GRAD0 "
                "RECV_GRAD1 B1 SEND_GRAD1 STEP0 "
                "RECV_ACT2 F2 SEND_ACT2 RECV_ACT3 F3 SEND_ACT3 RECV_GRAD2 B2 SEND_GRAD2 "
                "RECV_GRAD3 B3 SEND_GRAD3 STEP1",
                "RECV_ACT0 F0 B0 SEND_GRAD0 RECV_ACT1 F1 B1 SEND_GRAD1 STEP0 "
                "RECV_ACT2 F2 B2 SEND_GRAD2 RECV_ACT3 F3 B3 SEND_GRAD3 STEP1",
            }));
}

TEST(GoldenTest, GPipeTwoStagesTwoMicroBatches) {
  EXPECT_EQ(Formatted({ScheduleKind::kGPipe, 2, 2, 1}),
            (std::vector<std::string>{
                "F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 RECV_GRAD1 B1 STEP0",
                "RECV_ACT0 F0 RECV_ACT1 F1 B0 SEND_GRAD0 B1 SEND_GRAD1 STEP0",
            }));
}

TEST(GoldenTest, TwoBWTwoStagesTwoMicroBatchesTwoSteps) {
  // One continuous 1F1B over 4 micro-batches; STEP<t> right after (the SEND_GRAD of) the
  // stage's last backward of mini-batch t; no flush.
  EXPECT_EQ(Formatted({ScheduleKind::kTwoBW, 2, 2, 2}),
            (std::vector<std::string>{
                "F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 F2 SEND_ACT2 RECV_GRAD1 B1 STEP0 "
                "F3 SEND_ACT3 RECV_GRAD2 B2 RECV_GRAD3 B3 STEP1",
                "RECV_ACT0 F0 B0 SEND_GRAD0 RECV_ACT1 F1 B1 SEND_GRAD1 STEP0 "
                "RECV_ACT2 F2 B2 SEND_GRAD2 RECV_ACT3 F3 B3 SEND_GRAD3 STEP1",
            }));
}

TEST(GoldenTest, SingleStageHasNoCommunication) {
  EXPECT_EQ(Formatted({ScheduleKind::kOneFOneB, 1, 2, 1}),
            (std::vector<std::string>{"F0 B0 F1 B1 STEP0"}));
  EXPECT_EQ(Formatted({ScheduleKind::kGPipe, 1, 2, 1}),
            (std::vector<std::string>{"F0 F1 B0 B1 STEP0"}));
  EXPECT_EQ(Formatted({ScheduleKind::kTwoBW, 1, 1, 3}),
            (std::vector<std::string>{"F0 B0 STEP0 F1 B1 STEP1 F2 B2 STEP2"}));
}

TEST(GoldenTest, ParsedGoldenEqualsBuilt) {
  absl::StatusOr<std::vector<Action>> built =
      BuildStageSchedule({ScheduleKind::kOneFOneB, 2, 3, 1}, 1);
  ASSERT_TRUE(built.ok());
  EXPECT_EQ(*built, Parse("RECV_ACT0 F0 B0 SEND_GRAD0 RECV_ACT1 F1 B1 SEND_GRAD1 "
                          "RECV_ACT2 F2 B2 SEND_GRAD2 STEP0"));
}

TEST(TwoBWTest, VersionForMicroBatch) {
  // m = 4: mini-batches 0 and 1 use W(0); mini-batch t >= 1 uses W(t-1).
  const int m = 4;
  const std::vector<int64_t> expected = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3};
  for (int64_t j = 0; j < static_cast<int64_t>(expected.size()); ++j) {
    EXPECT_EQ(TwoBWVersionForMicroBatch(j, m), expected[j]) << "j=" << j;
  }
  EXPECT_EQ(TwoBWVersionForMicroBatch(0, 1), 0);
  EXPECT_EQ(TwoBWVersionForMicroBatch(1, 1), 0);
  EXPECT_EQ(TwoBWVersionForMicroBatch(2, 1), 1);
  EXPECT_EQ(TwoBWVersionForMicroBatch(7, 1), 6);
  EXPECT_EQ(TwoBWVersionForMicroBatch(23, 8), 1);
  EXPECT_EQ(TwoBWVersionForMicroBatch(24, 8), 2);
  EXPECT_EQ(TwoBWVersionForMicroBatch(1000003, 1000), 999);
}

// For every stage, the first F of mini-batch t+2 (which uses version t+1) comes after
// STEP<t> (which creates version t+1), and after STEP<t> the only versions still used are
// t (in-flight micro-batches of mini-batch t+1) and t+1: never more than two live.
TEST(TwoBWTest, NewVersionExistsBeforeUse) {
  const int steps = 4;
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      absl::StatusOr<std::vector<std::vector<Action>>> stages =
          BuildSchedule({ScheduleKind::kTwoBW, p, m, steps});
      ASSERT_TRUE(stages.ok()) << stages.status();
      for (int s = 0; s < p; ++s) {
        const std::vector<Action>& list = (*stages)[s];
        std::map<int64_t, size_t> step_pos, first_f_of_batch;
        for (size_t i = 0; i < list.size(); ++i) {
          if (list[i].kind == ActionKind::kOptimizerStep) step_pos[list[i].index] = i;
          if (list[i].kind == ActionKind::kForward) first_f_of_batch.emplace(list[i].index / m, i);
        }
        ASSERT_EQ(step_pos.size(), static_cast<size_t>(steps));
        for (int t = 0; t + 2 < steps; ++t) {
          EXPECT_LT(step_pos[t], first_f_of_batch[t + 2])
              << "p=" << p << " m=" << m << " s=" << s << " t=" << t;
        }
        // Live versions: the newest (count of STEPs done) and the oldest any in-flight or
        // upcoming-before-next-STEP action still uses.
        int64_t newest = 0;
        std::map<int64_t, int> in_flight;  // micro-batch -> 1 between F and B
        for (const Action& a : list) {
          if (a.kind == ActionKind::kOptimizerStep) newest = a.index + 1;
          if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) {
            const int64_t v = TwoBWVersionForMicroBatch(a.index, m);
            EXPECT_LE(v, newest) << "version used before it exists";
            if (a.kind == ActionKind::kForward) in_flight[a.index] = 1;
            if (a.kind == ActionKind::kBackward) in_flight.erase(a.index);
          }
          int64_t oldest = newest;
          for (const auto& [j, unused] : in_flight) {
            oldest = std::min(oldest, TwoBWVersionForMicroBatch(j, m));
          }
          EXPECT_LE(newest - oldest, 1) << "more than two live versions at stage " << s;
        }
      }
    }
  }
}

TEST(TwoBWTest, ContinuousAcrossSteps) {
  // No flush: stage 0 of p=3, m=3 does not drain before starting mini-batch 1.
  absl::StatusOr<std::vector<Action>> list = BuildStageSchedule({ScheduleKind::kTwoBW, 3, 3, 2}, 0);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(FormatActions(*list),
            "F0 SEND_ACT0 F1 SEND_ACT1 F2 SEND_ACT2 RECV_GRAD0 B0 F3 SEND_ACT3 RECV_GRAD1 B1 "
            "F4 SEND_ACT4 RECV_GRAD2 B2 STEP0 F5 SEND_ACT5 RECV_GRAD3 B3 RECV_GRAD4 B4 "
            "RECV_GRAD5 B5 STEP1");
}

// A 2BW list with the micro-batch and step numbers moved up by `steps` mini-batches.
std::vector<Action> Shifted(std::vector<Action> list, int64_t steps, int m) {
  for (Action& a : list) a.index += a.kind == ActionKind::kOptimizerStep ? steps : steps * m;
  return list;
}

size_t IndexOf(const std::vector<Action>& list, const Action& action) {
  return static_cast<size_t>(std::find(list.begin(), list.end(), action) - list.begin());
}

// A flush before mini-batch N (a step command, runtime/control) makes 2BW run as two jobs
// back to back, and changes nothing a stage may already have run when it learns of it:
// stage 0 learns at its STEP<N-2>, stage s > 0 with the activation of micro-batch N*m-1.
TEST(TwoBWFlushTest, DrainsAtTheBoundaryAndKeepsThePrefixWhereCommandsArrive) {
  const int steps = 4;
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 16; ++m) {
      const ScheduleParams plain{ScheduleKind::kTwoBW, p, m, steps};
      for (int64_t n = 1; n < steps; ++n) {
        ScheduleParams flushed = plain;
        flushed.flush_before = {n};
        SCOPED_TRACE(testing::Message() << "p=" << p << " m=" << m << " flush before " << n);
        absl::StatusOr<std::vector<std::vector<Action>>> lists = BuildSchedule(flushed);
        ASSERT_TRUE(lists.ok()) << lists.status();
        absl::StatusOr<SimulationResult> sim = Simulate(*lists, CostModel::Uniform(1.0, 2.0));
        ASSERT_TRUE(sim.ok()) << sim.status();
        for (int s = 0; s < p; ++s) {
          const std::vector<Action> with = (*lists)[s];
          const std::vector<Action> without = *BuildStageSchedule(plain, s);
          // Two jobs back to back: steps [0, n), then [n, steps).
          std::vector<Action> expected =
              *BuildStageSchedule({ScheduleKind::kTwoBW, p, m, static_cast<int>(n)}, s);
          const std::vector<Action> rest = Shifted(
              *BuildStageSchedule({ScheduleKind::kTwoBW, p, m, static_cast<int>(steps - n)}, s), n,
              m);
          expected.insert(expected.end(), rest.begin(), rest.end());
          EXPECT_EQ(FormatActions(with), FormatActions(expected)) << "stage " << s;
          // Where the commands become known, the lists still agree.
          size_t common = 0;
          while (common < with.size() && common < without.size() &&
                 with[common] == without[common]) {
            ++common;
          }
          const int64_t carrier = n * m - 1;
          if (s > 0) {
            EXPECT_LT(IndexOf(without, RecvAct(carrier)), common) << "stage " << s;
          } else if (n >= 2) {
            const size_t seal = IndexOf(without, Step(n - 2));
            EXPECT_LT(seal, common);
            // ... and the carrying activation leaves stage 0 after it sealed.
            EXPECT_LT(seal, IndexOf(without, p > 1 ? SendAct(carrier) : F(carrier)));
          }
        }
      }
    }
  }
}

TEST(TwoBWFlushTest, BoundaryOutsideTheJobIsAnError) {
  ScheduleParams params{ScheduleKind::kTwoBW, 2, 2, 3};
  params.flush_before = {0, 3};
  absl::Status status = ValidateScheduleParams(params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("flush_before 0 is not a boundary"));
  EXPECT_THAT(status.message(), HasSubstr("flush_before 3 is not a boundary"));
}

// PipeDream's lists are 2BW's (its weights differ, not its order), and exist for m < p too.
TEST(ScheduleKindTest, PipeDreamRunsTwoBWsListsForAnyMicroBatchCount) {
  for (int p = 1; p <= 4; ++p) {
    for (int m = 1; m <= 5; ++m) {
      const ScheduleParams pipedream{ScheduleKind::kPipeDream, p, m, 3, {2}};
      ASSERT_TRUE(ValidateScheduleParams(pipedream).ok()) << "p=" << p << " m=" << m;
      if (m < p) continue;
      const ScheduleParams two_bw{ScheduleKind::kTwoBW, p, m, 3, {2}};
      EXPECT_EQ(*BuildSchedule(pipedream), *BuildSchedule(two_bw)) << "p=" << p << " m=" << m;
    }
  }
}

// Every kind's traits say what its lists do, checked on the lists themselves: its record is
// its own; it holds chunks iff its actions name stages, splits backwards iff they hold I and
// W, runs continuously iff a later step's forward comes before an earlier step's update on
// stage 0, places its chunks as LayoutOf does, takes its default v and no fewer micro-batches
// than its rule (one fewer is refused), keeps stale weights iff it runs continuously. The
// negative control: a record with any one field wrong fails (checked).
TEST(ScheduleTraits, EveryKindsRecordSaysWhatItsListsDo) {
  struct Seen {
    bool chunks = false, splits = false, continuous = false;
    ChunkPlacement placement = ChunkPlacement::kLoop;
    int v = 1, fewest_m = 1;
  };
  std::map<ScheduleKind, Seen> seen;
  std::set<std::string_view> names;
  for (const ScheduleKind kind : kScheduleKinds) {
    SCOPED_TRACE(std::string(ScheduleKindName(kind)));
    const ScheduleTraits& t = TraitsOf(kind);
    EXPECT_EQ(t.kind, kind);
    EXPECT_TRUE(names.insert(t.name).second) << "a name of two kinds";
    const int p = 2;
    ScheduleParams params{kind, p, 4 * p, 2};
    params.virtual_stages = t.default_virtual_stages;
    ASSERT_TRUE(ValidateScheduleParams(params).ok()) << ValidateScheduleParams(params);
    absl::StatusOr<std::vector<Action>> list = BuildStageSchedule(params, 0);
    ASSERT_TRUE(list.ok()) << list.status();
    Seen& s = seen[kind];
    bool updated = false;
    for (const Action& a : *list) {
      if (a.stage != kOwnStage) s.chunks = true;
      if (a.kind == ActionKind::kInputGradient || a.kind == ActionKind::kWeightGradient) {
        s.splits = true;
      }
      if (a.kind == ActionKind::kOptimizerStep && a.index == 0) updated = true;
      if (a.kind == ActionKind::kForward && a.index >= params.micro_batches && !updated) {
        s.continuous = true;  // step 1's forward before step 0's update
      }
    }
    s.placement = LayoutOf(params).placement;
    s.v = LayoutOf(params).chunks_per_rank;
    for (int m = 1; m <= 4 * p; ++m) {
      ScheduleParams fewer = params;
      fewer.micro_batches = m;
      if (ValidateScheduleParams(fewer).ok()) {
        s.fewest_m = m;
        break;
      }
    }
  }
  auto agrees = [&](const ScheduleTraits& t, const Seen& s) {
    return t.holds_chunks == s.chunks && t.splits_backward == s.splits &&
           t.runs_continuously == s.continuous && t.placement == s.placement &&
           t.default_virtual_stages == s.v &&
           std::max(1, t.micro_batches_per_rank * 2) == s.fewest_m &&
           // Only a flushing kind's updates are the un-pipelined step's: the continuous ones
           // keep stale weights (2bw two buffers, pipedream a stash a micro-batch).
           (t.weights == WeightPolicy::kFlush) == !s.continuous;
  };
  for (const ScheduleKind kind : kScheduleKinds) {
    SCOPED_TRACE(std::string(ScheduleKindName(kind)));
    EXPECT_TRUE(agrees(TraitsOf(kind), seen[kind]));
    // The negative control: a record with any one field wrong disagrees with the lists.
    const ScheduleTraits right = TraitsOf(kind);
    std::vector<ScheduleTraits> wrong(7, right);
    wrong[0].holds_chunks = !right.holds_chunks;
    wrong[1].splits_backward = !right.splits_backward;
    wrong[2].runs_continuously = !right.runs_continuously;
    wrong[3].placement =
        right.placement == ChunkPlacement::kV ? ChunkPlacement::kLoop : ChunkPlacement::kV;
    wrong[4].default_virtual_stages = right.default_virtual_stages + 1;
    wrong[5].micro_batches_per_rank = right.micro_batches_per_rank + 1;
    wrong[6].weights =
        right.weights == WeightPolicy::kFlush ? WeightPolicy::kStashed : WeightPolicy::kFlush;
    for (size_t k = 0; k < wrong.size(); ++k) {
      EXPECT_FALSE(agrees(wrong[k], seen[kind])) << "field " << k << " wrong went unseen";
    }
  }
  EXPECT_EQ(TraitsOf(ScheduleKind::kPipeDream).weights, WeightPolicy::kStashed);
  EXPECT_EQ(TraitsOf(ScheduleKind::kTwoBW).weights, WeightPolicy::kDoubleBuffered);
}

}  // namespace
}  // namespace pipetrain::schedule
