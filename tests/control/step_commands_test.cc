#include "runtime/control/step_commands.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::control {
namespace {

using ::testing::HasSubstr;

TEST(StepCommandQueue, EarliestOpenBoundaryAndSealing) {
  StepCommandQueue queue(10);
  EXPECT_EQ(queue.earliest_open(), 2);  // boundary 1 is fixed before the job starts
  absl::StatusOr<int64_t> at = queue.Schedule(kFlush, 0);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, 2);
  ASSERT_TRUE(queue.Schedule(kCheckpoint, 2).ok());
  ASSERT_TRUE(queue.Schedule(kSwitchVersion, 7).ok());
  EXPECT_EQ(queue.Seal(2), kFlush | kCheckpoint);
  EXPECT_EQ(queue.earliest_open(), 3);
  EXPECT_EQ(queue.Seal(3), 0u);

  absl::StatusOr<int64_t> late = queue.Schedule(kFlush, 3);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.status().message(), HasSubstr("earliest still open is 4"));
  EXPECT_EQ(queue.Seal(7), kSwitchVersion);
}

TEST(StepCommandQueue, RefusesBoundariesOutsideTheJobAndAfterAStop) {
  StepCommandQueue queue(6);
  for (int64_t step : {-1, 6, 9}) {
    absl::StatusOr<int64_t> at = queue.Schedule(kFlush, step);
    EXPECT_EQ(at.status().code(), absl::StatusCode::kInvalidArgument) << step;
    EXPECT_THAT(at.status().message(), HasSubstr("1 <= N < 6"));
  }
  EXPECT_EQ(queue.Schedule(0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(queue.Schedule(1u << 7, 3).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(queue.Schedule(kStop, 3).ok());
  absl::StatusOr<int64_t> after = queue.Schedule(kFlush, 4);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(after.status().message(), HasSubstr("stops at step 3"));
}

TEST(StepCommandQueue, NamesRoundTrip) {
  for (StepCommand c : {kFlush, kSwitchVersion, kCheckpoint, kStop}) {
    absl::StatusOr<StepCommand> parsed = ParseStepCommand(StepCommandsName(c));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_EQ(StepCommandsName(kFlush | kStop), "flush+stop");
  EXPECT_EQ(StepCommandsName(0), "");
  EXPECT_EQ(*ParseStepCommand("Switch-Version"), kSwitchVersion);
  EXPECT_THAT(ParseStepCommand("pause").status().message(), HasSubstr("accepted: flush"));
}

// Schedule from one thread while the stage seals from another: every command is either
// refused or sealed exactly once, never lost.
TEST(StepCommandQueue, EveryAcceptedCommandIsSealedOnce) {
  const int64_t steps = 2000;
  StepCommandQueue queue(steps);
  std::vector<uint32_t> sealed(steps, 0);
  std::thread stage([&] {
    for (int64_t n = 2; n < steps; ++n) sealed[n] = queue.Seal(n);
  });
  std::vector<int64_t> accepted;
  for (int64_t n = 2; n < steps; ++n) {
    if (queue.Schedule(kFlush, n).ok()) accepted.push_back(n);
  }
  stage.join();
  for (int64_t n : accepted) EXPECT_EQ(sealed[n], kFlush) << n;
  int64_t total = 0;
  for (uint32_t s : sealed) total += s != 0;
  EXPECT_EQ(total, static_cast<int64_t>(accepted.size()));
}

}  // namespace
}  // namespace pipetrain::control
