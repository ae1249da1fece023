// Memory as planned and as run, as processes: planned jobs within their caps and the plan's
// per-stage prediction, PipeDream's versions and the schedules with chunks against
// `plan --predict`, and stage processes that hold no more tensors after more steps.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_fixture.h"

using namespace pipetrain::cli_test;  // NOLINT: the fixture's helpers

namespace {

// A planned job stays within the memory it was planned for: run as processes under two caps,
// every stage's measured peak of tensor bytes (counted at the allocator) is at most the cap
// and within 15% of the plan's prediction for it. The tighter cap leaves room for the plan to
// move: the layers are split by the times a fresh profile measures, which swing under load
// (at a cap of 3.5 MB a loaded run once found no layout: 3.49 MB needed, 3.15 MB plannable).
TEST_F(CliTest, PlannedRunsStayWithinTheMemoryTheyWereGiven) {
  setenv("PIPETRAIN_CACHE_DIR", (dir_ / "profiles").c_str(), 1);
  for (const int64_t cap : {4'500'000, 4'000'000}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    const std::string job =
        " --planner hippie --steps 10 --memory-per-worker " + std::to_string(cap);
    Result planned = Run("plan --workers 2 -o json -q" + job);
    ASSERT_EQ(planned.exit_code, 0) << planned.err;
    const auto plan = AutoRuns(nlohmann::json::parse(planned.out));
    SCOPED_TRACE("what stages: auto runs of the plan: " + plan.dump());
    const fs::path summary = dir_ / "summary.json";
    Result run = Run("run --launch processes --stages auto --plan-workers 2 -q --summary " +
                     summary.string() + job);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const auto ran = nlohmann::json::parse(ReadFile(summary));
    ASSERT_EQ(ran["partition"], plan["stages"]);
    const auto& predicted = plan["predicted_peak_memory_bytes"];
    ASSERT_EQ(ran["per_stage"].size(), predicted.size());
    for (size_t s = 0; s < predicted.size(); ++s) {
      const double measured = ran["per_stage"][s]["peak_tensor_bytes"].get<double>();
      const double expected = predicted[s].get<double>();
      EXPECT_LE(expected, cap) << "stage " << s;
      EXPECT_LE(measured, cap) << "stage " << s;
      EXPECT_NEAR(measured, expected, 0.15 * expected) << "stage " << s;
    }
  }
  unsetenv("PIPETRAIN_CACHE_DIR");
}

// `plan --predict` for a job, then the job run as processes.
class PredictedMemoryTest : public CliTest {
 protected:
  struct PredictedAndRun {
    nlohmann::json predicted;  // the plan's predicted_peak_memory_bytes (per rank)
    nlohmann::json per_stage;  // the run summary's
  };

  PredictedAndRun PredictThenRun(const std::string& job) {
    PredictedAndRun out;
    Result predicted = Run("plan --predict -o json" + job);
    EXPECT_EQ(predicted.exit_code, 0) << predicted.err;
    if (predicted.exit_code != 0) return out;
    out.predicted = nlohmann::json::parse(predicted.out)["predicted_peak_memory_bytes"];
    const fs::path summary = dir_ / "summary.json";
    Result run = Run("run --launch processes --summary " + summary.string() + job);
    EXPECT_EQ(run.exit_code, 0) << run.err;
    if (run.exit_code != 0) return out;
    out.per_stage = nlohmann::json::parse(ReadFile(summary))["per_stage"];
    return out;
  }
};

// PipeDream's weight stashing keeps p − s versions on stage s (m = 1): on a model whose
// parameters outweigh its activations, every stage's measured peak is within 15% of
// `plan --predict`'s, and stage 0's is not near what two versions (2BW's count) would give.
// Under vertical sync (the versions sent between the processes with the activations) the
// stages after the first keep 2 + (p − 1) = 5, stage 0 its p = 4, also within 15%.
TEST_F(PredictedMemoryTest, PipeDreamStagesHoldTheVersionsThePlanPredicts) {
  setenv("PIPETRAIN_CACHE_DIR", (dir_ / "profiles").c_str(), 1);
  const std::string job =
      " --schedule pipedream --d-model 256 --stages 4 --microbatches 1 --microbatch-size 1 "
      "--steps 6 -q";
  for (const bool vertical_sync : {true, false}) {
    SCOPED_TRACE(vertical_sync ? "vertical sync" : "");
    const PredictedAndRun synced =
        PredictThenRun(job + " --vertical-sync " + (vertical_sync ? "true" : "false"));
    ASSERT_EQ(synced.predicted.size(), 4u);
    ASSERT_EQ(synced.per_stage.size(), 4u);
    for (int s = 0; s < 4; ++s) {
      const double expected = synced.predicted[s].get<double>();
      EXPECT_NEAR(synced.per_stage[s]["peak_tensor_bytes"].get<double>(), expected, 0.15 * expected)
          << "stage " << s;
      EXPECT_EQ(synced.per_stage[s]["peak_weight_versions"],
                vertical_sync ? (s == 0 ? 4 : 5) : 4 - s)
          << "stage " << s;
    }
  }
  const PredictedAndRun r = PredictThenRun(job);
  // Negative control: stage 0 counted with 2 versions instead of 4.
  const double two_versions =
      r.predicted[0].get<double>() - 2 * r.per_stage[0]["parameter_bytes"].get<double>();
  EXPECT_GT(std::abs(r.per_stage[0]["peak_tensor_bytes"].get<double>() - two_versions),
            0.15 * two_versions);
  unsetenv("PIPETRAIN_CACHE_DIR");
}

// The schedules whose ranks hold several model stages: `plan --predict` simulates each rank's
// model stages, and as processes every rank's measured peak is within 15% of it. Also ZB-H1
// with recomputation, whose I recomputes what its W's then hold (left out of the
// prediction, the last rank measured 38% above it).
TEST_F(PredictedMemoryTest, SchedulesWithChunksRunWithinTheMemoryThePlanPredicts) {
  setenv("PIPETRAIN_CACHE_DIR", (dir_ / "profiles").c_str(), 1);
  const std::string shape = " --stages 2 --microbatches 8 --microbatch-size 8";
  for (const std::string& job :
       {"interleaved" + shape, "zb1p" + shape, "zbv" + shape, "dualpipev" + shape,
        std::string("zb1p --recompute layers:1,3 --stages 0:3,3:7 --microbatches 16 "
                    "--microbatch-size 4")}) {
    SCOPED_TRACE(job);
    const PredictedAndRun r = PredictThenRun(" --steps 6 -q --schedule " + job);
    ASSERT_EQ(r.predicted.size(), 2u);  // per rank
    ASSERT_EQ(r.per_stage.size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
      const double expected = r.predicted[rank].get<double>();
      EXPECT_NEAR(r.per_stage[rank]["peak_tensor_bytes"].get<double>(), expected, 0.15 * expected)
          << "rank " << rank;
    }
  }
  unsetenv("PIPETRAIN_CACHE_DIR");
}

// Stage processes hold no more tensors after 80 steps than after 10: what is sent is dropped
// once its peer has it (a Gloo send completes only when waited for).
// The same under ZB-V, whose messages between two ranks are numbered j x v + floor(s/p): the
// receives posted ahead must be for numbers that come (posted for j + 1 .. they stayed,
// 2 MB a step).
TEST_F(CliTest, StageProcessesHoldTheSameTensorsAfterMoreSteps) {
  for (const char* schedule : {"1f1b", "zbv"}) {
    SCOPED_TRACE(schedule);
    std::vector<std::vector<int64_t>> peaks;
    for (int steps : {10, 80}) {
      const fs::path summary = dir_ / "summary.json";
      Result r = Run(std::string("run --launch processes --stages 2 --schedule ") + schedule +
                     " --microbatches 2 --microbatch-size 8 -q --steps " + std::to_string(steps) +
                     " --summary " + summary.string());
      ASSERT_EQ(r.exit_code, 0) << r.err;
      std::vector<int64_t> peak;
      const auto report = nlohmann::json::parse(ReadFile(summary));
      for (const auto& s : report["per_stage"]) {
        peak.push_back(s["peak_tensor_bytes"].get<int64_t>());
        EXPECT_GT(peak.back(), 0);
      }
      peaks.push_back(peak);
    }
    // 70 steps more sent 140 activations and 140 gradients of 64 KiB each (9 MB; twice as
    // many under ZB-V); none is kept. When a message is dropped varies by a message or two.
    ASSERT_EQ(peaks[0].size(), 2u);
    for (int s = 0; s < 2; ++s) {
      EXPECT_LE(peaks[1][s], peaks[0][s] + (512 << 10)) << "stage " << s;
    }
  }
}

}  // namespace
