// StageActionStream, the list a rank's executor runs over steps: the list BuildStageSchedule
// makes, action for action, under drains, from a resumed job's first step, and Rebase.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/schedule/action.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::schedule {
namespace {

using ::testing::HasSubstr;

// The stream the executor runs is the eager list, action for action, under drains too.
std::vector<Action> Drained(StageActionStream stream) {
  std::vector<Action> out;
  const int64_t start = stream.position();
  for (; !stream.done(); stream.Advance()) {
    EXPECT_EQ(stream.position(), start + static_cast<int64_t>(out.size()));
    out.push_back(stream.current());
  }
  return out;
}

// `kind` on p ranks, m micro-batches, `steps` steps, with the kind's default chunks.
ScheduleParams Params(ScheduleKind kind, int p, int m, int steps) {
  ScheduleParams params{kind, p, m, steps};
  params.virtual_stages = DefaultVirtualStages(kind);
  return params;
}

TEST(StageActionStreamTest, IsTheListBuildStageScheduleMakes) {
  for (ScheduleKind kind : kScheduleKinds) {
    for (int p = 1; p <= 4; ++p) {
      for (int m = 1; m <= 5; ++m) {
        for (int steps = 1; steps <= 4; ++steps) {
          // Every set of drained boundaries (a bit each for 1 .. steps-1).
          for (int mask = 0; mask < (1 << (steps - 1)); ++mask) {
            ScheduleParams params{kind, p, m, steps};
            params.virtual_stages = DefaultVirtualStages(kind);
            if (!ValidateScheduleParams(params).ok()) continue;  // e.g. 2bw with m < p
            for (int n = 1; n < steps; ++n) {
              if (mask & (1 << (n - 1))) params.flush_before.push_back(n);
            }
            for (int s = 0; s < p; ++s) {
              SCOPED_TRACE(testing::Message()
                           << ScheduleKindName(kind) << " p=" << p << " m=" << m
                           << " steps=" << steps << " mask=" << mask << " stage " << s);
              absl::StatusOr<StageActionStream> stream = StageActionStream::Create(params, s);
              ASSERT_TRUE(stream.ok()) << stream.status();
              EXPECT_EQ(FormatActions(Drained(*stream)),
                        FormatActions(*BuildStageSchedule(params, s)));
            }
          }
        }
      }
    }
  }
  EXPECT_FALSE(StageActionStream::Create({ScheduleKind::kTwoBW, 4, 2, 1}, 0).ok());
  EXPECT_FALSE(StageActionStream::Create({ScheduleKind::kGPipe, 2, 2, 1}, 2).ok());
}

// A resumed job (first_step N) runs exactly what the uninterrupted job runs after a drain
// before N: the list from N is that list's actions of mini-batches >= N, which follow all of
// the earlier ones on every stage; the stream generates the same.
TEST(StageActionStreamTest, AResumedListIsTheDrainedListFromItsFirstStep) {
  for (ScheduleKind kind : kScheduleKinds) {
    for (int p = 1; p <= 4; ++p) {
      for (int m = 1; m <= 5; ++m) {
        if (!ValidateScheduleParams(Params(kind, p, m, 2)).ok()) continue;  // its shapes
        for (int steps = 2; steps <= 4; ++steps) {
          for (int first = 1; first < steps; ++first) {
            ScheduleParams drained = Params(kind, p, m, steps);
            drained.flush_before = {first};
            ScheduleParams resumed = Params(kind, p, m, steps);
            resumed.first_step = first;
            if (first + 1 < steps) {  // a later drain, too
              drained.flush_before.push_back(first + 1);
              resumed.flush_before.push_back(first + 1);
            }
            for (int s = 0; s < p; ++s) {
              SCOPED_TRACE(testing::Message()
                           << ScheduleKindName(kind) << " p=" << p << " m=" << m
                           << " steps=" << steps << " first=" << first << " stage " << s);
              const std::vector<Action> whole = *BuildStageSchedule(drained, s);
              auto mini_batch = [m](const Action& a) {
                return a.kind == ActionKind::kOptimizerStep ? a.index : a.index / m;
              };
              const auto from = std::find_if(whole.begin(), whole.end(), [&](const Action& a) {
                return mini_batch(a) >= first;
              });
              EXPECT_TRUE(std::all_of(from, whole.end(),
                                      [&](const Action& a) { return mini_batch(a) >= first; }));
              const std::vector<Action> tail(from, whole.end());
              absl::StatusOr<std::vector<Action>> eager = BuildStageSchedule(resumed, s);
              ASSERT_TRUE(eager.ok()) << eager.status();
              EXPECT_EQ(FormatActions(*eager), FormatActions(tail));
              absl::StatusOr<StageActionStream> stream = StageActionStream::Create(resumed, s);
              ASSERT_TRUE(stream.ok()) << stream.status();
              EXPECT_EQ(FormatActions(Drained(*stream)), FormatActions(tail));
            }
          }
        }
      }
    }
  }
  ScheduleParams bad{ScheduleKind::kOneFOneB, 2, 2, 3};
  bad.first_step = 3;
  bad.flush_before = {1};
  const absl::Status status = ValidateScheduleParams(bad);
  EXPECT_THAT(status.message(), HasSubstr("first_step must be in [0, steps=3): got 3"));
  EXPECT_THAT(status.message(), HasSubstr("flush_before 1 is not a boundary: 3 < N < steps=3"));
}

// Rebase (a drain or a stop learned mid-run) succeeds exactly where the new list agrees with
// the old one through the current action, and then goes on as the new list.
TEST(StageActionStreamTest, RebaseFollowsTheNewListOrRefusesAChangedPast) {
  const int steps = 4;
  for (ScheduleKind kind : kScheduleKinds) {
    for (int p = 1; p <= 3; ++p) {
      for (int m = p; m <= 4; ++m) {
        const ScheduleParams plain = Params(kind, p, m, steps);
        if (!ValidateScheduleParams(plain).ok()) continue;  // the kind's shapes
        for (int n = 1; n < steps; ++n) {
          for (bool stop : {false, true}) {
            ScheduleParams changed = plain;
            if (stop) {
              changed.steps = n;
            } else {
              changed.flush_before = {n};
            }
            for (int s = 0; s < p; ++s) {
              SCOPED_TRACE(testing::Message()
                           << ScheduleKindName(kind) << " p=" << p << " m=" << m
                           << (stop ? " stop " : " drain ") << n << " stage " << s);
              const std::vector<Action> before = *BuildStageSchedule(plain, s);
              const std::vector<Action> after = *BuildStageSchedule(changed, s);
              StageActionStream stream = *StageActionStream::Create(plain, s);
              for (size_t i = 0; i < before.size(); ++i, stream.Advance()) {
                const bool same_past =
                    i < after.size() &&
                    std::equal(before.begin(), before.begin() + i + 1, after.begin());
                absl::StatusOr<StageActionStream> rebased = stream.Rebase(changed);
                if (!same_past) {
                  EXPECT_FALSE(rebased.ok()) << "at " << i;
                  continue;
                }
                ASSERT_TRUE(rebased.ok()) << "at " << i << ": " << rebased.status();
                EXPECT_EQ(rebased->position(), static_cast<int64_t>(i));
                const std::vector<Action> rest = Drained(*rebased);
                EXPECT_EQ(FormatActions(rest),
                          FormatActions(std::vector<Action>(after.begin() + i, after.end())))
                    << "at " << i;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pipetrain::schedule
