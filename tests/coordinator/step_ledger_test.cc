// The step ledger and the report checks, pure: reports in, committed steps, losses,
// throughput and straggler ratios out; no coordinator, no clock.
#include "coordinator/step_ledger.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/report_checks.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::StepReport Report(int rank, int64_t step, double compute_s = 0,
                      std::optional<double> loss = std::nullopt, double end_s = 0) {
  v1::StepReport r;
  r.set_rank(rank);
  r.set_step(step);
  r.set_compute_s(compute_s);
  r.set_end_s(end_s);
  if (loss) {
    r.set_has_loss(true);
    r.set_loss(*loss);
  }
  return r;
}

std::vector<int64_t> Steps(const StepLedger::Recorded& recorded) {
  std::vector<int64_t> steps;
  for (const auto& s : recorded.committed) steps.push_back(s.step);
  return steps;
}

// 2 stages x 2 replicas: a step is committed once all four ranks finished it, with the mean
// of the two last stages' losses; a rank ahead commits nothing until the slowest catches up.
TEST(StepLedger, AStepIsCommittedWhenEveryRankFinishedItWithTheReplicasMeanLoss) {
  StepLedger ledger(/*ranks=*/4, /*stages=*/2, /*start_step=*/0, /*committed=*/-1, 1000);
  EXPECT_TRUE(ledger.Record(Report(0, 0)).committed.empty());
  EXPECT_TRUE(ledger.Record(Report(1, 0, 0, 2.0)).committed.empty());
  EXPECT_TRUE(ledger.Record(Report(2, 0)).committed.empty());
  EXPECT_TRUE(ledger.Record(Report(0, 1)).committed.empty());  // ahead
  const StepLedger::Recorded last = ledger.Record(Report(3, 0, 0, 4.0));
  ASSERT_THAT(Steps(last), ElementsAre(0));
  EXPECT_DOUBLE_EQ(*last.committed[0].loss, 3.0);
  EXPECT_EQ(ledger.committed(), 0);
  // Ranks 1..3 finish step 1 and 2 in one go for rank 0's sake: 1 commits, then 2 with it.
  ledger.Record(Report(1, 1, 0, 1.0));
  ledger.Record(Report(2, 1));
  EXPECT_THAT(Steps(ledger.Record(Report(3, 1))), ElementsAre(1));
  EXPECT_EQ(ledger.committed(), 1);
}

// A step's loss is summed in replica order, whatever order the last stages' reports came
// in, so two runs that computed the same losses report the same mean to the bit. The losses
// are chosen so that float addition in another order gives another sum (the negative
// control below checks that it does).
TEST(StepLedger, TheLossIsSummedInReplicaOrderWhateverTheOrderOfTheReports) {
  const std::vector<double> losses = {1e16, 1.0, -1e16, 3.0};  // replicas 0..3
  const double in_replica_order = (((losses[0] + losses[1]) + losses[2]) + losses[3]) / 4;
  std::vector<int> order = {0, 1, 2, 3};
  std::set<double> arrival_sums;
  int orders = 0;
  do {
    StepLedger ledger(/*ranks=*/4, /*stages=*/1, 0, -1, 1000);
    StepLedger::Recorded last;
    double arrival_sum = 0;
    for (int replica : order) {
      last = ledger.Record(Report(replica, 0, 0, losses[replica]));
      arrival_sum += losses[replica];
    }
    arrival_sums.insert(arrival_sum / 4);
    ASSERT_THAT(Steps(last), ElementsAre(0));
    EXPECT_EQ(*last.committed[0].loss, in_replica_order) << "reports in another order";
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 24);
  // Negative control: summed in the order they arrived, the orders give different means.
  EXPECT_GT(arrival_sums.size(), 1u);
}

// The survivors go on from step 3 after rank 3 was lost: steps 1 and 2, which not every rank
// reported, are committed now; step 1's loss is the job loss a last stage reported (the other
// replica's report never came), step 2's the loss a survivor held with its update; a step
// whose replicas all reported keeps their mean.
TEST(StepLedger, CommitThroughCommitsTheStepsTheSurvivorsStandPast) {
  StepLedger ledger(4, 2, 0, -1, 1000);
  for (int rank = 0; rank < 4; ++rank) {
    ledger.Record(Report(rank, 0, 0, rank % 2 ? std::optional<double>(rank) : std::nullopt));
  }
  ASSERT_EQ(ledger.committed(), 0);
  for (int rank = 0; rank < 3; ++rank) {
    v1::StepReport r = Report(rank, 1, 0, rank == 1 ? std::optional<double>(5.0) : std::nullopt);
    if (rank == 1) {
      r.set_has_job_loss(true);
      r.set_job_loss(4.5);
    }
    ledger.Record(r);
  }
  ASSERT_EQ(ledger.committed(), 0);
  const std::vector<StepLedger::CommittedStep> steps = ledger.CommitThrough(2, 3.25);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 1);
  EXPECT_EQ(steps[0].loss, 4.5);
  EXPECT_EQ(steps[1].step, 2);
  EXPECT_EQ(steps[1].loss, 3.25);
  EXPECT_EQ(ledger.committed(), 2);
  EXPECT_TRUE(ledger.CommitThrough(2, std::nullopt).empty());
}

// Ranks running ahead of each other at random (16 ranks, 2,000 reports, also for a
// generation resumed by its first report): after every report, what is committed is the
// slowest rank's last step, each step committed once and in order.
TEST(StepLedger, TheCommittedStepIsAlwaysTheSlowestRanksLastStep) {
  for (int64_t start : {int64_t{0}, int64_t{-1}}) {
    SCOPED_TRACE(start);
    std::mt19937 random(7);
    StepLedger ledger(/*ranks=*/16, /*stages=*/4, start, /*committed=*/-1, 1000);
    const int64_t first = start < 0 ? 40 : 0;  // a resumed generation starts at step 40
    std::vector<int64_t> last(16, first - 1);
    int64_t committed = -1, expected_next = first;
    for (int k = 0; k < 2000; ++k) {
      const int rank = static_cast<int>(random() % 16);
      const StepLedger::Recorded recorded = ledger.Record(Report(rank, ++last[rank]));
      for (const StepLedger::CommittedStep& step : recorded.committed) {
        EXPECT_EQ(step.step, expected_next++);
      }
      committed = *std::min_element(last.begin(), last.end());
      ASSERT_EQ(ledger.committed(), std::max<int64_t>(committed, first - 1)) << "report " << k;
    }
    EXPECT_GT(committed, first + 50);  // the run got somewhere
  }
}

TEST(StepLedger, ReportsAreExpectedInOrderAndResentOnesAreRecognised) {
  StepLedger ledger(2, 2, /*start_step=*/3, /*committed=*/2, 0);
  EXPECT_EQ(ledger.last_step(0), 2);
  EXPECT_EQ(ledger.Expects(2, 3), StepLedger::Order::kNext);
  EXPECT_EQ(ledger.Expects(2, 2), StepLedger::Order::kResent);
  EXPECT_EQ(ledger.Expects(2, 1), StepLedger::Order::kResent);
  EXPECT_EQ(ledger.Expects(2, 5), StepLedger::Order::kOutOfOrder);
}

// A generation resumed by its spec: where it starts is what its first report says; every
// rank is taken to start there, and the steps before it count as committed.
TEST(StepLedger, AResumedGenerationStartsWhereItsFirstReportSays) {
  StepLedger ledger(2, 2, /*start_step=*/-1, /*committed=*/-1, 0);
  EXPECT_EQ(ledger.Expects(-1, 7), StepLedger::Order::kNext);  // any first step
  EXPECT_TRUE(ledger.Record(Report(0, 7)).committed.empty());
  EXPECT_EQ(ledger.start_step(), 7);
  EXPECT_EQ(ledger.committed(), 6);
  EXPECT_EQ(ledger.last_step(1), 6);
  EXPECT_EQ(ledger.Expects(ledger.last_step(1), 9), StepLedger::Order::kOutOfOrder);
  EXPECT_THAT(Steps(ledger.Record(Report(1, 7, 0, 0.5))), ElementsAre(7));
}

// Tokens per second from rank 0's clock, from the generation's first reported step on.
TEST(StepLedger, ThroughputComesFromRankZerosEndTimes) {
  StepLedger ledger(1, 1, 0, -1, /*tokens_per_step=*/512);
  EXPECT_FALSE(ledger.Record(Report(0, 0, 0, 1.0, /*end_s=*/10)).tokens_per_s);
  EXPECT_FALSE(ledger.Record(Report(0, 1, 0, 1.0, /*end_s=*/10)).tokens_per_s);  // no time
  EXPECT_DOUBLE_EQ(*ledger.Record(Report(0, 2, 0, 1.0, /*end_s=*/12)).tokens_per_s, 512.0);
}

// The median step time, as the runner's summary has it: rank 0's step-to-step times after
// its first reported step, against the median computed here from the same end times.
TEST(StepLedger, StepTimeIsTheMedianOfRankZerosStepToStepTimes) {
  StepLedger ledger(2, 2, 0, -1, 1);
  const std::vector<double> ends = {5.0, 5.5, 6.5, 6.7, 9.7, 10.1, 10.4};
  std::vector<double> gaps;
  for (size_t step = 0; step < ends.size(); ++step) {
    ledger.Record(Report(1, static_cast<int64_t>(step), 0, 1.0, 100.0 * step));  // not rank 0
    const StepLedger::Recorded r =
        ledger.Record(Report(0, static_cast<int64_t>(step), 0, std::nullopt, ends[step]));
    if (step == 0) {
      EXPECT_FALSE(r.step_time_s);
      continue;
    }
    gaps.push_back(ends[step] - ends[step - 1]);
    std::vector<double> sorted = gaps;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    ASSERT_TRUE(r.step_time_s);
    EXPECT_NEAR(*r.step_time_s, median, 1e-12) << "after step " << step;
  }
}

// Compute per step (its first, with warm-up, skipped) as a moving average weighing the
// newest step 1/8; each stage's over the median of its replica's stages.
TEST(StepLedger, StragglerRatiosFollowEachStagesComputePerStep) {
  StepLedger ledger(3, 3, 0, -1, 0);
  for (int rank = 0; rank < 3; ++rank) ledger.Record(Report(rank, 0, 100.0));  // warm-up
  ledger.Record(Report(0, 1, 101.0));
  ledger.Record(Report(1, 1, 102.0));
  const StepLedger::Recorded r = ledger.Record(Report(2, 1, 104.0));
  EXPECT_EQ(r.replica_first_rank, 0);
  EXPECT_THAT(r.straggler_ratios, ElementsAre(0.5, 1.0, 2.0));
  // One slow step moves the average by 1/8 of the difference.
  ledger.Record(Report(2, 2, 104.0 + 12.0));
  EXPECT_DOUBLE_EQ(ledger.step_compute_s()[2], 4.0 + (12.0 - 4.0) / 8);
  EXPECT_TRUE(StragglerRatios({1.0, 0.0}).empty());  // a stage without a measure yet
}

TEST(ReportChecks, EachBadFieldIsNamed) {
  const std::string where = "job job-0001 rank 1";
  v1::StepReport ok = Report(1, 0, 1.0);
  EXPECT_TRUE(CheckStepReportFields(ok, 2, where).ok());
  struct Case {
    const char* what;
    std::function<void(v1::StepReport&)> spoil;
    const char* message;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases = {
      {"NaN time", [&](v1::StepReport& r) { r.set_compute_s(nan); }, "times must be finite"},
      {"negative wait", [](v1::StepReport& r) { r.set_wait_s(-1); }, "times must be finite"},
      {"negative bytes", [](v1::StepReport& r) { r.set_peak_memory_bytes(-1); },
       "negative byte counts"},
      {"relative checkpoint", [](v1::StepReport& r) { r.set_checkpoint_committed("ckpt/x"); },
       "absolute path"},
      {"checkpoint from replica 1",
       [](v1::StepReport& r) {
         r.set_rank(2);
         r.set_checkpoint_committed("/ckpt/x");
       },
       "rank of replica 0"},
      {"control character", [](v1::StepReport& r) { r.set_checkpoint_committed("/a\nb"); },
       "without control characters"},
      {"resumed_from not from rank 0", [](v1::StepReport& r) { r.set_resumed_from("/c"); },
       "reported by rank 0"},
      {"infinite breakdown",
       [](v1::StepReport& r) {
         r.mutable_breakdown()->set_forward_s(std::numeric_limits<double>::infinity());
       },
       "breakdown times must be finite"},
      {"layers not a range",
       [](v1::StepReport& r) {
         r.set_layers_begin(4);
         r.set_layers_end(2);
       },
       "are not a range"},
      {"bubble above 1",
       [](v1::StepReport& r) { r.mutable_breakdown()->set_last_step_bubble_ratio(1.5); },
       "a bubble ratio is at most 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::StepReport bad = ok;
    c.spoil(bad);
    const absl::Status s = CheckStepReportFields(bad, 2, where);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
    EXPECT_THAT(std::string(s.message()), HasSubstr(where));
  }
  v1::StepReport resumed = Report(0, 0, 1.0);
  resumed.set_resumed_from("/ckpt/step-00000003");
  resumed.add_passed_over("step-00000004: manifest unreadable");
  EXPECT_TRUE(CheckStepReportFields(resumed, 2, where).ok());
}

}  // namespace
}  // namespace pipetrain::coordinator
