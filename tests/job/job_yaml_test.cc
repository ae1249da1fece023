// A JobConfig written as YAML (what `pipetrain run` submits to its local cluster) reads back
// to the same job.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/job/job_config.h"

namespace pipetrain::job {
namespace {

using ::testing::HasSubstr;

void ExpectRoundTrip(const JobConfig& c) {
  const std::string yaml = JobConfigToYaml(c);
  absl::StatusOr<JobConfig> back = ParseJobYaml(yaml);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << yaml;
  EXPECT_EQ(JobConfigToYaml(*back), yaml);
  EXPECT_EQ(back->model.name, c.model.name);
  EXPECT_EQ(back->schedule, c.schedule);
  EXPECT_EQ(back->stages, c.stages);
  EXPECT_EQ(back->stage_ranges.size(), c.stage_ranges.size());
  EXPECT_EQ(back->replicas, c.replicas);
  EXPECT_EQ(back->micro_batches, c.micro_batches);
  EXPECT_EQ(back->steps, c.steps);
  EXPECT_EQ(back->optimizer.lr, c.optimizer.lr);  // exactly: all digits are written
  EXPECT_EQ(back->optimizer.eps, c.optimizer.eps);
  EXPECT_EQ(back->float64, c.float64);
  EXPECT_EQ(back->seed, c.seed);
  EXPECT_EQ(FormatRecompute(back->recompute), FormatRecompute(c.recompute));
  EXPECT_EQ(back->recv_timeout_s, c.recv_timeout_s);
}

TEST(JobYaml, DefaultsRoundTrip) { ExpectRoundTrip(JobConfig{}); }

TEST(JobYaml, EveryKindOfFieldRoundTrips) {
  JobConfig c;
  c.schedule = schedule::ScheduleKind::kGPipe;
  c.stage_ranges = {{0, 2}, {2, 4}, {4, 7}};
  c.stages = 3;
  c.replicas = 2;
  c.overlap_allreduce = false;
  c.bucket_kib = 64;
  c.micro_batches = 6;
  c.micro_batch_size = 3;
  c.steps = 17;
  c.optimizer = {"sgd", 0.1 / 3};
  c.optimizer.momentum = 0.5;
  c.optimizer.weight_decay = 1e-4;
  c.recompute = *ParseRecompute("layers:1,3");
  c.seed = 987654321012345ULL;
  c.float64 = true;
  c.threads_per_stage = 2;
  c.recv_timeout_s = 7.25;
  c.model.dropout = 0.125;
  c.data.seq_len = 12;
  c.data.vocab = 40;
  ExpectRoundTrip(c);
  EXPECT_THAT(JobConfigToYaml(c), HasSubstr("stages: [[0, 2], [2, 4], [4, 7]]"));

  JobConfig mlp;
  mlp.model.name = "mlp";
  mlp.data.kind = "classification";
  mlp.schedule = schedule::ScheduleKind::kOneFOneB;
  mlp.stages = 2;
  ExpectRoundTrip(mlp);
}

}  // namespace
}  // namespace pipetrain::job
