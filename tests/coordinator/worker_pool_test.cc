// The worker registry: every way a worker is lost (silent, marked by the coordinator) reaches
// the one lost-worker listener with the rank it ran and why; a released worker's loss carries
// no rank; heartbeats keep a worker alive. No coordinator, no clock but absl::Time values.
#include "coordinator/worker_pool.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

v1::WorkerInfo Info(const std::string& id) {
  v1::WorkerInfo info;
  info.set_id(id);
  info.set_address(id + ":7071");
  return info;
}

TEST(WorkerPool, EveryLossReachesTheListenerWithTheRankItRan) {
  WorkerPool pool;
  std::vector<WorkerPool::Lost> heard;
  pool.SetLostListener([&](const WorkerPool::Lost& lost) { heard.push_back(lost); });
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* id : {"worker-1", "worker-2", "worker-3"}) {
    pool.Add(Info(id), nullptr, std::string("session-") + id, t0);
  }
  pool.Assign(*pool.Find("worker-1"), "job-0001", 0, /*generation=*/2);
  pool.Assign(*pool.Find("worker-2"), "job-0001", 1, 2);

  // worker-2 and worker-3 heartbeat; worker-1 falls silent.
  ASSERT_TRUE(pool.Heartbeat("worker-2", t0 + absl::Seconds(3)).ok());
  ASSERT_TRUE(pool.Heartbeat("worker-3", t0 + absl::Seconds(3)).ok());
  EXPECT_EQ(pool.ExpireSilent(t0 + absl::Seconds(5), absl::Seconds(4)), 1);
  ASSERT_EQ(heard.size(), 1u);
  EXPECT_EQ(heard[0].id, "worker-1");
  EXPECT_EQ(heard[0].job_id, "job-0001");
  EXPECT_EQ(heard[0].rank, 0);
  EXPECT_EQ(heard[0].generation, 2);
  EXPECT_EQ(heard[0].silent, absl::Seconds(5));
  EXPECT_THAT(heard[0].why, HasSubstr("stopped sending heartbeats (none for 5s)"));
  EXPECT_EQ(pool.Find("worker-1")->info.state(), v1::WORKER_STATE_LOST);
  EXPECT_FALSE(pool.Heartbeat("worker-1", t0 + absl::Seconds(6)).ok());      // register again
  EXPECT_EQ(pool.ExpireSilent(t0 + absl::Seconds(6), absl::Seconds(4)), 0);  // told once

  // Marked by the coordinator: the rank goes with it.
  pool.MarkLost(*pool.Find("worker-2"), t0 + absl::Seconds(6), "stopped (it was shut down)");
  ASSERT_EQ(heard.size(), 2u);
  EXPECT_EQ(heard[1].rank, 1);
  EXPECT_EQ(heard[1].why, "stopped (it was shut down)");

  // A worker released first (its rank moved elsewhere) is lost without a rank.
  pool.Assign(*pool.Find("worker-3"), "job-0002", 0, 1);
  pool.Release(*pool.Find("worker-3"));
  pool.MarkLost(*pool.Find("worker-3"), t0 + absl::Seconds(6), "unreachable");
  ASSERT_EQ(heard.size(), 3u);
  EXPECT_EQ(heard[2].job_id, "");
  EXPECT_EQ(heard[2].rank, -1);
  EXPECT_TRUE(pool.IdleIds().empty());
}

// The coordinator stalled for 5 s right after the workers' heartbeats: that time is not their
// silence, so none is lost at the tick after the stall; one that stays silent after it is lost
// once the limit has passed again, and one that heartbeats lives on. The negative control:
// the same tick without the stall excused loses all three.
TEST(WorkerPool, ACoordinatorStallIsNotTheWorkersSilence) {
  for (const bool excused : {true, false}) {
    SCOPED_TRACE(excused ? "stall excused" : "not excused (the negative control)");
    WorkerPool pool;
    std::vector<std::string> lost;
    pool.SetLostListener([&](const WorkerPool::Lost& l) { lost.push_back(l.id); });
    const absl::Time t0 = absl::FromUnixSeconds(1000);
    for (const char* id : {"worker-1", "worker-2", "worker-3"}) {
      pool.Add(Info(id), nullptr, std::string("session-") + id, t0);
    }
    const absl::Time back = t0 + absl::Seconds(5);  // the stall: [t0 + 0.1 s, t0 + 5 s)
    const absl::Duration limit = absl::Seconds(2);
    if (excused) EXPECT_EQ(pool.ExcuseSilence(absl::Milliseconds(4900), back), 3);
    const int expired = pool.ExpireSilent(back, limit);
    if (!excused) {
      EXPECT_EQ(expired, 3);
      continue;
    }
    EXPECT_EQ(expired, 0) << "lost after the stall: " << lost.size();
    // Only worker-2 heartbeats after the stall; the others are lost 2 s after it (0.1 s of
    // their silence came before it).
    ASSERT_TRUE(pool.Heartbeat("worker-2", back + absl::Milliseconds(500)).ok());
    EXPECT_EQ(pool.ExpireSilent(back + absl::Milliseconds(1800), limit), 0);
    EXPECT_EQ(pool.ExpireSilent(back + absl::Milliseconds(1950), limit), 2);
    EXPECT_EQ(lost, (std::vector<std::string>{"worker-1", "worker-3"}));
    // A stall never moves a heartbeat past the moment the coordinator is back.
    EXPECT_EQ(pool.ExcuseSilence(absl::Hours(1), back + absl::Seconds(2)), 1);
    EXPECT_EQ(pool.ExpireSilent(back + absl::Seconds(4) + absl::Milliseconds(1), limit), 1);
  }
}

}  // namespace
}  // namespace pipetrain::coordinator
