// What `stages: auto` runs (jobspec/planned_layout.h RunMarkedSchedule): the schedule
// `pipetrain plan` marks on the planner's shape, as a job that validates and round-trips
// through the job spec, on GPUs as on CPUs; the planner's own where the ranks span hosts,
// and where no schedule with the same updates is faster (a 2BW plan stays 2BW).
#include "jobspec/planned_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/job/job_spec.h"
#include "runtime/planner/schedule_choice.h"
#include "tests/planner/even_layout.h"

namespace pipetrain::jobspec {
namespace {

using planner::Candidate;
using planner::Layout;
using schedule::ScheduleKind;
using ::testing::HasSubstr;

// A GPT of 8 layers (embedding, 5 blocks, norm, head) as a `stages: auto` job.
job::JobSpec AutoJob() {
  job::JobSpec c;
  c.mutable_model()->set_n_layers(5);
  c.set_auto_stages(true);
  c.clear_stage_ranges();
  c.set_planner("hippie");
  return c;
}

// A plan whose planner chose `layout`, predicted on `profile`.
planner::PlanResult PlanOf(const planner::ModelProfile& profile,
                           const planner::ClusterProfile& cluster, const Layout& layout) {
  planner::PlanResult plan;
  plan.planner = planner::PlannerKind::kHippie;
  plan.chosen.layout = layout;
  plan.chosen.prediction = planner::Predict(profile, cluster, layout).value();
  plan.chosen.fits = true;
  plan.data_parallel = plan.chosen;
  return plan;
}

// The option CompareSchedules marks on `layout`'s shape.
ScheduleKind Marked(const planner::ModelProfile& profile, const planner::ClusterProfile& cluster,
                    const Layout& layout) {
  for (const planner::ScheduleOption& o : planner::CompareSchedules(profile, cluster, layout)) {
    if (o.best) return o.schedule;
  }
  return layout.schedule;
}

TEST(RunMarkedSchedule, AutoRunsTheScheduleThePlanMarksAsAJobThatValidates) {
  const planner::ModelProfile profile = planner::Uniform(8, 0.01, 0.001);
  const planner::ClusterProfile cluster = planner::FreeLinks();
  const Layout chosen = planner::Even(ScheduleKind::kOneFOneB, 8, 2, 8);
  const ScheduleKind marked = Marked(profile, cluster, chosen);
  // Uniform layers, free links, m = 4p: a zero-bubble schedule beats 1F1B's bubble.
  ASSERT_TRUE(schedule::HoldsChunks(marked)) << schedule::ScheduleKindName(marked);
  planner::PlanResult plan = PlanOf(profile, cluster, chosen);
  const job::JobSpec config = AutoJob();
  const std::string line = RunMarkedSchedule(profile, cluster, config, &plan);
  EXPECT_THAT(line, HasSubstr("runs " + std::string(schedule::ScheduleKindName(marked))));
  EXPECT_THAT(line, HasSubstr("against 1f1b's"));
  EXPECT_EQ(plan.chosen.layout.schedule, marked);
  EXPECT_LT(plan.chosen.prediction.step_time_s,
            PlanOf(profile, cluster, chosen).chosen.prediction.step_time_s);
  EXPECT_GT(plan.chosen.memory_efficiency, 0);

  const job::JobSpec planned = WithLayout(config, plan.chosen.layout);
  EXPECT_TRUE(job::ValidateJob(planned).ok()) << job::ValidateJob(planned);
  EXPECT_EQ(job::ScheduleOf(planned), marked);
  EXPECT_EQ(job::PipelineStages(planned), 2);  // the ranks of the planner's shape
  EXPECT_EQ(planned.microbatches(), 8);
  EXPECT_EQ(static_cast<int>(job::StageRangesOf(planned).size()), 2 * job::VirtualStages(planned));
  // Through the job spec (what the coordinator stores and the workers run) unchanged.
  v1::JobSpec spec;
  spec.mutable_model()->set_n_layers(5);
  MarkForPlanning(&spec);
  absl::StatusOr<job::JobSpec> back = job::Validated(WithLayout(spec, plan.chosen.layout));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(job::ScheduleOf(*back), marked);
  EXPECT_EQ(job::VirtualStages(*back), job::VirtualStages(planned));
  EXPECT_EQ(job::StageRangesOf(*back).size(), job::StageRangesOf(planned).size());
}

TEST(RunMarkedSchedule, ThePlannersOwnStaysWhereTheMarkedOneCannotRun) {
  const planner::ModelProfile profile = planner::Uniform(8, 0.01, 0.001);
  const planner::ClusterProfile cluster = planner::FreeLinks();
  const Layout chosen = planner::Even(ScheduleKind::kOneFOneB, 8, 2, 8);
  // On GPUs the schedules with chunks run as on CPUs (NCCL has a link per boundary).
  job::JobSpec on_gpus = AutoJob();
  on_gpus.set_device("cuda");
  planner::PlanResult plan = PlanOf(profile, cluster, chosen);
  EXPECT_THAT(RunMarkedSchedule(profile, cluster, on_gpus, &plan), HasSubstr("runs "));
  EXPECT_EQ(plan.chosen.layout.schedule, Marked(profile, cluster, chosen));
  EXPECT_TRUE(schedule::HoldsChunks(plan.chosen.layout.schedule));
  // Ranks placed on hosts: the comparison does not place them.
  planner::ClusterProfile two_hosts = cluster;
  two_hosts.host_workers = {1, 1};
  Layout placed = chosen;
  placed.rank_hosts = {0, 1};
  plan = PlanOf(profile, two_hosts, placed);
  EXPECT_EQ(RunMarkedSchedule(profile, two_hosts, AutoJob(), &plan), "");
  EXPECT_EQ(plan.chosen.layout.schedule, ScheduleKind::kOneFOneB);
  // 2BW's updates are its own: no other schedule stands in.
  plan = PlanOf(profile, cluster, planner::Even(ScheduleKind::kTwoBW, 8, 2, 8));
  EXPECT_EQ(RunMarkedSchedule(profile, cluster, AutoJob(), &plan), "");
  EXPECT_EQ(plan.chosen.layout.schedule, ScheduleKind::kTwoBW);
}

}  // namespace
}  // namespace pipetrain::jobspec
