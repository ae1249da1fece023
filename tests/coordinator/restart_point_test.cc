// The restart point of a generation, event by event: reports of committed checkpoints, steps
// committed and a drain in; the restart point's moves, the final checkpoint and the drained
// generation's end out. No coordinator, no clock, no sockets.
#include "coordinator/restart_point.h"

#include <string>
#include <variant>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kSteps = 100;

struct ReportCheckpoint {  // a rank committed the checkpoint before `step`
  int64_t step;
  std::string dir;
};
struct CommitThrough {  // every step up to `step` is committed
  int64_t step;
};
struct DrainAt {
  std::string worker;
  int64_t step;
};
using Input = std::variant<ReportCheckpoint, CommitThrough, DrainAt>;

// Runs `inputs` on a generation whose job's restart point starts at `restart_point`, applying
// each move as the coordinator does; what came out, in words.
std::vector<std::string> Feed(const std::vector<Input>& inputs, int64_t restart_point = 0) {
  RestartPoint point;
  std::vector<std::string> out;
  for (const Input& input : inputs) {
    if (const auto* r = std::get_if<ReportCheckpoint>(&input)) {
      point.Reported(r->step, r->dir, restart_point);
    } else if (const auto* d = std::get_if<DrainAt>(&input)) {
      point.Drain(d->worker, "h:1", d->step);
    } else {
      const RestartPoint::Decision decision =
          point.Committed(std::get<CommitThrough>(input).step, restart_point, kSteps);
      if (decision.final_one) {
        out.push_back(
            absl::StrCat("final ", decision.final_one->step, " ", decision.final_one->dir));
      }
      if (decision.restart_point) {
        restart_point = decision.restart_point->step;
        out.push_back(
            absl::StrCat("restart point ", restart_point, " ", decision.restart_point->dir));
      }
      if (decision.drained) out.push_back("end: " + *decision.drained);
    }
  }
  return out;
}

TEST(RestartPoint, MovesOnlyOnceEveryStepBeforeTheCheckpointIsCommitted) {
  EXPECT_THAT(Feed({ReportCheckpoint{50, "c/step-50"}, CommitThrough{47}, CommitThrough{48},
                    CommitThrough{49}, CommitThrough{50}}),
              ElementsAre("restart point 50 c/step-50"));
}

TEST(RestartPoint, ACommitBeforeTheReportMovesNothingUntilTheNextCommit) {
  // The last stage commits step 49 before rank 0's report of the checkpoint arrives.
  EXPECT_THAT(Feed({CommitThrough{49}, ReportCheckpoint{50, "c/step-50"}}), IsEmpty());
  EXPECT_THAT(Feed({CommitThrough{49}, ReportCheckpoint{50, "c/step-50"}, CommitThrough{50}}),
              ElementsAre("restart point 50 c/step-50"));
}

TEST(RestartPoint, ACheckpointNotNewerThanTheRestartPointCountsForNothing) {
  EXPECT_THAT(Feed({ReportCheckpoint{50, "old"}, CommitThrough{60}}, /*restart_point=*/50),
              IsEmpty());
  EXPECT_THAT(Feed({ReportCheckpoint{40, "older"}, CommitThrough{60}}, /*restart_point=*/50),
              IsEmpty());
}

TEST(RestartPoint, ANewerReportReplacesAPendingOne) {
  EXPECT_THAT(Feed({ReportCheckpoint{50, "c/50"}, ReportCheckpoint{60, "c/60"}, CommitThrough{55},
                    CommitThrough{59}}),
              ElementsAre("restart point 60 c/60"));
}

TEST(RestartPoint, MovesOncePerCheckpoint) {
  EXPECT_THAT(Feed({ReportCheckpoint{50, "c/50"}, CommitThrough{49}, CommitThrough{50},
                    CommitThrough{51}, ReportCheckpoint{60, "c/60"}, CommitThrough{59}}),
              ElementsAre("restart point 50 c/50", "restart point 60 c/60"));
}

TEST(RestartPoint, TheFinalCheckpointIsAnnouncedNotARestartPoint) {
  EXPECT_THAT(Feed({ReportCheckpoint{kSteps, "c/final"}, CommitThrough{kSteps - 1},
                    CommitThrough{kSteps - 1}}),
              ElementsAre(absl::StrCat("final ", kSteps, " c/final")));
}

TEST(RestartPoint, ADrainEndsTheGenerationOnceItsCheckpointIsTheRestartPoint) {
  EXPECT_THAT(Feed({DrainAt{"worker-3", 50}, ReportCheckpoint{50, "c/50"}, CommitThrough{48}}),
              IsEmpty());
  EXPECT_THAT(
      Feed({DrainAt{"worker-3", 50}, ReportCheckpoint{50, "c/50"}, CommitThrough{49}}),
      ElementsAre("restart point 50 c/50",
                  "end: worker-3 (h:1) was stopped (drained) after the checkpoint before step 50"));
}

TEST(RestartPoint, AnOlderCheckpointDoesNotEndADrain) {
  // The policy's checkpoint at 40 commits first; the drain's, at 50, is still to come.
  EXPECT_THAT(Feed({DrainAt{"worker-3", 50}, ReportCheckpoint{40, "c/40"}, CommitThrough{39}}),
              ElementsAre("restart point 40 c/40"));
}

TEST(RestartPoint, TheFirstDrainOfAGenerationCountsAndResetForgetsIt) {
  RestartPoint point;
  point.Drain("worker-1", "h:1", 50);
  point.Drain("worker-2", "h:2", 70);
  EXPECT_EQ(point.drain_step(), 50);
  point.Reported(50, "c/50", 0);
  const RestartPoint::Decision decision = point.Committed(49, 0, kSteps);
  ASSERT_TRUE(decision.drained);
  EXPECT_THAT(*decision.drained, ::testing::StartsWith("worker-1 (h:1)"));
  point.Reset();
  EXPECT_EQ(point.drain_step(), 0);
  EXPECT_FALSE(point.Committed(60, 0, kSteps).restart_point);  // the report went with it
}

}  // namespace
}  // namespace pipetrain::coordinator
