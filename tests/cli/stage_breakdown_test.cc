// `pipetrain metrics`' table and JSON from a hand-made job record: totals become
// milliseconds per step done, a straggler above 1.5 is marked, a rank that has not reported
// shows no row and missing values show "-".
#include "client/stage_breakdown.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace {

using ::pipetrain::client::StageBreakdownJson;
using ::pipetrain::client::StageBreakdownTable;
using ::testing::HasSubstr;
using ::testing::Not;

pipetrain::v1::Job TwoStages() {
  pipetrain::v1::Job job;
  job.set_id("job-0007");
  job.set_steps(100);
  job.set_step(9);
  job.set_loss(1.25);
  job.set_data_unit("tok");
  for (int s = 0; s < 2; ++s) {
    auto* st = job.add_stage_status();
    st->set_stage(s);
    st->set_worker_id("worker-" + std::to_string(s + 1));
    st->set_step(9);  // 10 steps done
    st->set_peak_memory_bytes(int64_t{300} << 20);
    auto* b = st->mutable_breakdown();
    b->set_forward_s(0.5 + s);  // 50 ms / 150 ms per step
    b->set_backward_s(1.0);     // 100 ms
    b->set_optimizer_s(0.02);   // 2 ms
    b->set_receive_forward_s(s == 1 ? 0.3 : 0);
    b->set_receive_backward_s(s == 0 ? 0.4 : 0);
    b->set_send_forward_s(0.01);
    b->set_send_backward_s(0.03);  // send: 4 ms per step
    b->set_last_step_s(0.25);
    b->set_last_step_bubble_ratio(0.2);
    st->set_straggler_ratio(s == 0 ? 0.8 : 1.6);
  }
  return job;
}

TEST(StageBreakdown, TableShowsMillisecondsPerStepDoneAndMarksTheStraggler) {
  const std::string table = StageBreakdownTable(TwoStages());
  EXPECT_THAT(table, HasSubstr("job job-0007: step 10/100  loss 1.2500"));
  // stage 0: forward 50, backward 100, optimizer 2, recv_act 0, recv_grad 40, send 4.
  EXPECT_THAT(table,
              HasSubstr("worker-1     10            50.00    100.00      2.00      0.00     40.00  "
                        "    4.00      0.00    250.00    0.20       0.80  300.0 MiB\n"));
  EXPECT_THAT(
      table,
      HasSubstr("worker-2     10           150.00    100.00      2.00     30.00      0.00      "
                "4.00      0.00    250.00    0.20       1.60  300.0 MiB  <- straggler\n"));
  EXPECT_EQ(table.find("<- straggler"), table.rfind("<- straggler"));
}

TEST(StageBreakdown, RanksWithoutReportsHaveNoRowAndMissingValuesShowADash) {
  pipetrain::v1::Job job = TwoStages();
  job.mutable_stage_status(1)->set_step(-1);
  job.mutable_stage_status(0)->mutable_breakdown()->set_last_step_s(0);  // one step only
  job.mutable_stage_status(0)->set_straggler_ratio(0);
  job.mutable_stage_status(0)->set_peak_memory_bytes(0);
  const std::string table = StageBreakdownTable(job);
  EXPECT_THAT(table, Not(HasSubstr("worker-2")));
  EXPECT_THAT(table, HasSubstr("      0.00         -       -          -          -\n"));
  job.mutable_stage_status(0)->set_step(-1);
  EXPECT_THAT(StageBreakdownTable(job), HasSubstr("(no step reported yet)"));
}

TEST(StageBreakdown, JsonHasTheSameNumbers) {
  const nlohmann::json j = StageBreakdownJson(TwoStages());
  EXPECT_EQ(j["job_id"], "job-0007");
  ASSERT_EQ(j["stages"].size(), 2u);
  const nlohmann::json& s1 = j["stages"][1];
  EXPECT_EQ(s1["worker"], "worker-2");
  EXPECT_EQ(s1["steps"], 10);
  EXPECT_DOUBLE_EQ(s1["ms_per_step"]["forward"].get<double>(), 150.0);
  EXPECT_DOUBLE_EQ(s1["ms_per_step"]["recv_act"].get<double>(), 30.0);
  EXPECT_DOUBLE_EQ(s1["ms_per_step"]["send"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(s1["straggler_ratio"].get<double>(), 1.6);
  EXPECT_DOUBLE_EQ(s1["last_step_bubble_ratio"].get<double>(), 0.2);
  EXPECT_EQ(s1["peak_memory_bytes"], int64_t{300} << 20);
}

}  // namespace
