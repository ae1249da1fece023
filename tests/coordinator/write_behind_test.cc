// The coordinator's write-behind queue over a store that fails on demand: order of writes,
// the latest record winning, failed writes kept for the next flush, a failed submission
// taken back.
#include "coordinator/write_behind.h"

#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/coordinator/coordinator_fakes.h"

namespace pipetrain::coordinator {
namespace {

using testing_fakes::FakeStore;

StoredStep Row(int64_t step, double loss) {
  StoredStep row;
  row.step = step;
  row.generation = 1;
  row.has_loss = true;
  row.loss = loss;
  return row;
}

TEST(WriteBehind, NothingIsWrittenUntilAFlushAndThenTheLatestRecordWins) {
  auto data = std::make_shared<FakeStore::Data>();
  FakeStore store(data);
  WriteBehind writes(&store);
  writes.QueueJob("job-0001", 0, "first");
  writes.QueueJob("job-0001", 0, "second");
  writes.QueueEvent("job-0001", 5, "submitted");
  writes.QueueSteps("job-0001", {Row(0, 2.5)});
  EXPECT_TRUE(data->jobs.empty());
  EXPECT_TRUE(data->events.empty());
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(data->jobs.at("job-0001").job, "second");
  EXPECT_EQ(data->puts, 1);  // the replaced record is never written
  ASSERT_EQ(data->events["job-0001"].size(), 1u);
  EXPECT_EQ(data->events["job-0001"][0].text, "submitted");
  EXPECT_EQ(data->steps["job-0001"].at(0).loss, 2.5);
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(data->puts, 1);  // nothing queued: nothing written again
}

TEST(WriteBehind, AFailedWriteStaysQueuedWithItsStepsAndLosesItsEvents) {
  auto data = std::make_shared<FakeStore::Data>();
  FakeStore store(data);
  WriteBehind writes(&store);
  writes.QueueSteps("job-0001", {Row(0, 3.0)});
  writes.QueueJob("job-0001", 0, "step 0 done");
  writes.QueueEvent("job-0001", 5, "step 1/2");
  data->fail_puts = true;
  const absl::Status failed = writes.Flush();
  EXPECT_THAT(std::string(failed.message()), ::testing::HasSubstr("disk I/O error"));
  EXPECT_TRUE(data->jobs.empty());
  EXPECT_TRUE(data->events["job-0001"].empty());
  // A later step queued meanwhile: written after the kept one, so its row wins.
  writes.QueueSteps("job-0001", {Row(0, 1.0)});
  data->fail_puts = false;
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(data->jobs.at("job-0001").job, "step 0 done");
  EXPECT_EQ(data->steps["job-0001"].at(0).loss, 1.0);
  EXPECT_TRUE(data->events["job-0001"].empty());  // dropped with the failed batch
}

TEST(WriteBehind, ANewerRecordQueuedDuringAFailedFlushIsKept) {
  auto data = std::make_shared<FakeStore::Data>();
  FakeStore store(data);
  WriteBehind writes(&store);
  writes.QueueJob("job-0001", 0, "old");
  data->fail_puts = true;
  EXPECT_FALSE(writes.Flush().ok());
  writes.QueueJob("job-0001", 0, "new");  // as if queued while the failed write ran
  data->fail_puts = false;
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(data->jobs.at("job-0001").job, "new");
}

TEST(WriteBehind, DiscardTakesBackARecordWhoseWriteFailedOnly) {
  auto data = std::make_shared<FakeStore::Data>();
  FakeStore store(data);
  WriteBehind writes(&store);
  writes.QueueJob("job-0001", 0, "accepted");
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_FALSE(writes.Discard("job-0001"));  // durable: nothing to take back
  writes.QueueJob("job-0002", 1, "refused");
  writes.QueueEvent("job-0002", 5, "submitted");
  data->fail_puts = true;
  EXPECT_FALSE(writes.Flush().ok());
  EXPECT_TRUE(writes.Discard("job-0002"));
  data->fail_puts = false;
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(data->jobs.count("job-0002"), 0u);
  EXPECT_TRUE(data->events["job-0002"].empty());
}

}  // namespace
}  // namespace pipetrain::coordinator
