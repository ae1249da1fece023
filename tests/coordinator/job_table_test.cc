// The coordinator's job table alone: submission order whatever the ids, a change that wakes
// watchers and queues the record with the steps committed since, progress queued at most
// once a second while every other change is queued at once, events at the clock's time.
#include "coordinator/job_table.h"

#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/coordinator/coordinator_fakes.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using testing_fakes::FakeStore;

// A queued job's entry whose record says `id` and `step`.
JobEntry Entry(const std::string& id, int64_t step = -1) {
  v1::Job job;
  job.set_id(id);
  job.set_step(step);
  return JobEntry(JobController({std::make_shared<FakeClock>()}, job, job::JobSpec()));
}

v1::Job StoredRecord(const FakeStore::Data& data, const std::string& id) {
  v1::Job job;
  EXPECT_TRUE(job.ParseFromString(data.jobs.at(id).job));
  return job;
}

TEST(JobTable, JobsComeInSubmissionOrderWhateverTheirIds) {
  auto data = std::make_shared<FakeStore::Data>();
  FakeStore store(data);
  WriteBehind writes(&store);
  JobTable jobs(&writes, std::make_shared<FakeClock>(), [] {});
  for (const char* id : {"job-b", "job-c", "job-a"}) {
    jobs.Add(id, Entry(id));
  }
  EXPECT_EQ(jobs.next_order(), 3);
  std::vector<std::string> order;
  for (JobEntry* e : jobs.InOrder([](const JobEntry&) { return true; })) {
    order.push_back(e->controller.id());
  }
  EXPECT_THAT(order, ElementsAre("job-b", "job-c", "job-a"));
  EXPECT_EQ(jobs.InOrder([](const JobEntry& e) { return e.order > 0; }).size(), 2u);
  jobs.Remove("job-c");
  EXPECT_FALSE(jobs.contains("job-c"));
}

TEST(JobTable, ProgressIsQueuedOnceASecondAndEveryOtherChangeAtOnce) {
  auto data = std::make_shared<FakeStore::Data>();
  FakeStore store(data);
  WriteBehind writes(&store);
  auto clock = std::make_shared<FakeClock>();
  int woken = 0;
  JobTable jobs(&writes, clock, [&] { ++woken; });
  JobEntry& e = jobs.Add("job-0001", Entry("job-0001", 0));
  jobs.Changed(e);  // a state change: queued at once
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(StoredRecord(*data, "job-0001").step(), 0);
  EXPECT_EQ(e.version, 1);

  // Steps committed within the second, as a controller's effects say: not queued, but the
  // watchers are woken.
  for (int64_t step = 1; step <= 3; ++step) {
    e.controller = Entry("job-0001", step).controller;
    JobEffects effects;
    StoredStep row;
    row.step = step;
    effects.steps.push_back(row);
    effects.write = JobEffects::Write::kProgress;
    clock->Advance(absl::Milliseconds(300));
    jobs.Record(e, effects);
  }
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(StoredRecord(*data, "job-0001").step(), 0);
  EXPECT_TRUE(data->steps["job-0001"].empty());
  EXPECT_EQ(e.version, 4);
  EXPECT_EQ(woken, 4);
  // A second after the last write: the record and every step committed since.
  clock->Advance(absl::Milliseconds(100));
  jobs.Changed(e, /*progress_only=*/true);
  ASSERT_TRUE(writes.Flush().ok());
  EXPECT_EQ(StoredRecord(*data, "job-0001").step(), 3);
  EXPECT_EQ(data->steps["job-0001"].size(), 3u);
  EXPECT_TRUE(e.unwritten_steps.empty());

  jobs.Event("job-0001", "something happened");
  ASSERT_TRUE(writes.Flush().ok());
  ASSERT_EQ(data->events["job-0001"].size(), 1u);
  EXPECT_EQ(data->events["job-0001"][0].unix_ms, absl::ToUnixMillis(clock->Now()));
  EXPECT_EQ(woken, 6);
}

}  // namespace
}  // namespace pipetrain::coordinator
