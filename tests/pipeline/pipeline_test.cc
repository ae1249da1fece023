// Proof that pipelined training has the semantics docs/design.md section 4 claims, against
// independent references (the un-pipelined trainer with LibTorch's own optimizers,
// TrainReference, and a whole-batch gradient): GPipe and 1F1B equal the un-pipelined run,
// recomputation changes nothing, 2BW's delayed update and weight versions, step commands at
// their boundaries, the stash table, partition errors and the window of records a stage
// keeps. Replicas are in data_parallel_test.cc, other models (BatchNorm statistics, VGG,
// TorchScript) in pipeline_models_test.cc, broken messages and stops in
// pipeline_faults_test.cc; the shared helpers in pipeline_fixture.h.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <thread>

#include "runtime/control/step_commands.h"
#include "runtime/data/dataset.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/plan.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/model/model_zoo.h"
#include "runtime/schedule/schedule.h"
#include "runtime/schedule/simulator.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

struct Case {
  ScheduleKind kind;
  int stages, m;
  const char* recompute;
  bool float64;
};

class FlushEquivalence : public ::testing::TestWithParam<Case> {};

// GPipe and 1F1B-Flush: parameters after 5 steps equal the single-stage run.
TEST_P(FlushEquivalence, ParametersEqualUnpipelinedRun) {
  const Case k = GetParam();
  JobSpec c = TinyGpt(k.kind, k.stages, k.m);
  SetPrecision(
      c, k.float64 ? pipetrain::job::Precision::kFloat64 : pipetrain::job::Precision::kFloat32);
  SetRecompute(c, *ParseRecompute(k.recompute));
  JobReport report = MustRun(c);
  auto reference = MustReference(c);
  ASSERT_EQ(report.final_parameters.size(), reference.size());
  const double diff = MaxRelativeDifference(report.final_parameters, reference);
  EXPECT_LE(diff, k.float64 ? 1e-10 : 1e-5);
  // The parameters moved: the comparison is not between two untouched initializations.
  JobSpec zero_steps = c;
  zero_steps.set_steps(1);
  zero_steps.mutable_optimizer()->set_lr(1e-12);
  EXPECT_GT(MaxRelativeDifference(MustReference(zero_steps), reference), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Schedules, FlushEquivalence,
                         ::testing::Values(Case{ScheduleKind::kGPipe, 3, 4, "none", true},
                                           Case{ScheduleKind::kGPipe, 3, 4, "all", true},
                                           Case{ScheduleKind::kGPipe, 2, 3, "layers:1,2", false},
                                           Case{ScheduleKind::kOneFOneB, 4, 4, "none", true},
                                           Case{ScheduleKind::kOneFOneB, 4, 2, "stages:0,2", true},
                                           Case{ScheduleKind::kOneFOneB, 2, 4, "none", false},
                                           Case{ScheduleKind::kOneFOneB, 1, 4, "all", true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string recompute = info.param.recompute;
                           for (char& ch : recompute) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return std::string(schedule::ScheduleKindName(info.param.kind)) + "_p" +
                                  std::to_string(info.param.stages) + "_m" +
                                  std::to_string(info.param.m) + "_recompute_" + recompute +
                                  (info.param.float64 ? "_float64" : "_float32");
                         });

// Recomputation on vs off gives bitwise identical parameters, with dropout active.
TEST(Recompute, BitwiseEqualWithDropout) {
  for (const ScheduleCase& k : EveryScheduleKind(3)) {
    const ScheduleKind kind = k.kind;
    JobSpec c = TinyGpt(k, 4);
    SetPrecision(c, pipetrain::job::Precision::kFloat32);
    c.mutable_model()->set_dropout(0.2);
    c.clear_optimizer();
    c.mutable_optimizer()->set_name("adamw");
    c.mutable_optimizer()->set_lr(1e-2);
    JobReport off = MustRun(c);
    SetRecompute(c, *ParseRecompute("all"));
    JobReport all = MustRun(c);
    SetRecompute(c, *ParseRecompute("layers:0,2,3"));
    JobReport some = MustRun(c);
    EXPECT_TRUE(BitwiseEqual(off.final_parameters, all.final_parameters))
        << schedule::ScheduleKindName(kind);
    EXPECT_TRUE(BitwiseEqual(off.final_parameters, some.final_parameters))
        << schedule::ScheduleKindName(kind);
    // Dropout really is active: another seed for the masks changes the result.
    c.set_seed(c.seed() + 1);
    JobReport other_seed = MustRun(c);
    EXPECT_FALSE(BitwiseEqual(off.final_parameters, other_seed.final_parameters));
  }
}

// Gradient accumulation over micro-batches equals the whole mini-batch gradient: one SGD
// step with lr 1 and no momentum moves the weights by exactly the whole-batch gradient.
TEST(MicroBatching, OneStepEqualsWholeBatchGradient) {
  JobSpec c = TinyGpt(ScheduleKind::kGPipe, 3, 4);
  c.set_steps(1);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("sgd");
  c.mutable_optimizer()->set_lr(1.0);
  c.mutable_optimizer()->set_momentum(0);
  JobReport report = MustRun(c);

  model::ModelConfig mc = ModelConfigOf(c);
  mc.seed = c.seed();
  mc.float64 = true;
  mc.vocab_size = c.data().vocab();
  mc.seq_len = c.data().seq_len();
  auto layers = model::BuildModel(mc);
  ASSERT_TRUE(layers.ok());
  data::SyntheticCorpusOptions o;
  o.vocab = c.data().vocab();
  o.num_tokens = c.data().num_tokens();
  o.seed = c.data().seed();
  o.window.seq_len = c.data().seq_len();
  auto corpus = data::MakeSyntheticCorpus(o);
  ASSERT_TRUE(corpus.ok());
  data::BatchSampler sampler((*corpus)->num_samples(), c.seed(), 1, c.microbatches(),
                             c.microbatch_size());
  data::MicroBatch batch = (*corpus)->Read(sampler.GlobalBatchIds(0));
  at::Tensor x = torch::tensor(batch.input_tokens).reshape(batch.input_shape);
  at::Tensor y = torch::tensor(batch.targets).reshape(batch.target_shape);
  model::LayerContext ctx;
  ctx.seed = c.seed();
  for (size_t i = 0; i < layers->size(); ++i) {
    ctx.global_layer = static_cast<int>(i);
    x = (*layers)[i]->Forward(x, ctx);
  }
  at::cross_entropy_loss(x.reshape({-1, x.size(-1)}), y.reshape({-1})).backward();
  std::vector<at::Tensor> expected;
  for (const auto& layer : *layers) {
    for (const at::Tensor& p : layer->Parameters()) {
      expected.push_back((p - p.grad()).detach());
    }
  }
  EXPECT_LE(MaxRelativeDifference(report.final_parameters, expected), 1e-12);
}

// PipeDream-2BW: parameters equal the sequential float64 delayed-update simulation, every
// F and B used version max(floor(j/m) - 1, 0), and at most two versions were ever live.
TEST(TwoBW, MatchesDelayedUpdateAndVersionFormula) {
  for (const char* optimizer : {"sgd", "adamw"}) {
    for (auto [stages, m] : {std::pair{2, 2}, std::pair{3, 4}, std::pair{4, 4}}) {
      JobSpec c = TinyGpt(ScheduleKind::kTwoBW, stages, m);
      c.mutable_optimizer()->set_name(optimizer);
      if (std::string(optimizer) == "adamw") c.mutable_optimizer()->set_lr(1e-2);
      JobReport report = MustRun(c);
      auto reference = MustReference(c);
      SCOPED_TRACE(::testing::Message() << optimizer << " p=" << stages << " m=" << m);
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);

      // The delayed update really differs from the flushed one, so the check above can fail.
      JobSpec flushed = c;
      SetSchedule(flushed, ScheduleKind::kOneFOneB);
      EXPECT_GT(MaxRelativeDifference(MustReference(flushed), reference), 1e-6);

      int checked = 0;
      for (const auto& stats : report.stage_stats) {
        EXPECT_LE(stats.peak_weight_versions, 2);
        EXPECT_EQ(stats.peak_weight_versions, 2);  // 5 steps: two versions do coexist
        for (const auto& r : stats.records) {
          if (r.action.kind != ActionKind::kForward && r.action.kind != ActionKind::kBackward) {
            continue;
          }
          EXPECT_EQ(r.version, std::max<int64_t>(r.action.index / m - 1, 0))
              << schedule::ToString(r.action);
          ++checked;
        }
      }
      EXPECT_EQ(checked, 2 * stages * m * c.steps());
    }
  }
}

// Step commands (runtime/control) queued for a 2BW job, with and without replicas. A flush
// only changes timing: parameters bitwise equal to the plain run, and no stage starts
// mini-batch N before its update of N-1. A weight-version switch restarts the version rule
// at N (the reference does the same by hand). A stop gives the result of an N-step job.
// Every stage's step record names the commands at the boundary after it.
TEST(StepCommands, FlushSwitchAndStopTakeEffectAtTheirBoundaryOnEveryStage) {
  for (int replicas : {1, 2}) {
    JobSpec c = TinyGpt(ScheduleKind::kTwoBW, 3, 4);
    c.set_steps(8);
    c.set_replicas(replicas);
    SCOPED_TRACE(::testing::Message() << "w=" << replicas);
    const JobReport plain = MustRun(c);
    auto run_with = [&](std::vector<std::pair<control::StepCommand, int64_t>> commands) {
      RunOptions options;
      options.commands = std::make_shared<control::StepCommandQueue>(c.steps());
      for (auto [command, step] : commands) {
        absl::StatusOr<int64_t> at = options.commands->Schedule(command, step);
        EXPECT_TRUE(at.ok()) << at.status();
      }
      auto report = RunInProcess(c, options);
      EXPECT_TRUE(report.ok()) << report.status();
      return report.ok() ? *std::move(report) : JobReport{};
    };
    auto commands_after = [](const executor::StageStats& stats, int64_t step) {
      for (const auto& r : stats.steps) {
        if (r.step == step) return r.commands_after;
      }
      return ~0u;
    };

    // Flush before step 3.
    const JobReport flushed = run_with({{control::kFlush, 3}});
    EXPECT_TRUE(BitwiseEqual(flushed.final_parameters, plain.final_parameters));
    for (const auto& stats : flushed.stage_stats) {
      EXPECT_EQ(commands_after(stats, 2), control::kFlush);
      EXPECT_EQ(commands_after(stats, 3), 0u);
      bool updated = false;
      for (const auto& r : stats.records) {
        if (r.action.kind == ActionKind::kOptimizerStep && r.action.index == 2) updated = true;
        if (r.action.kind == ActionKind::kForward && r.action.index / c.microbatches() == 3) {
          EXPECT_TRUE(updated) << "F" << r.action.index << " before STEP2";
        }
      }
    }

    // Weight-version switches before steps 3 and 4 (back to back) and 6.
    const JobReport switched = run_with(
        {{control::kSwitchVersion, 3}, {control::kSwitchVersion, 4}, {control::kSwitchVersion, 6}});
    auto reference = TrainReference(c, {3, 4, 6});
    ASSERT_TRUE(reference.ok()) << reference.status();
    EXPECT_LE(MaxRelativeDifference(switched.final_parameters, *reference), 1e-10);
    EXPECT_GT(MaxRelativeDifference(plain.final_parameters, *reference), 1e-6);
    for (const auto& stats : switched.stage_stats) {
      EXPECT_EQ(commands_after(stats, 2), control::kSwitchVersion);
      EXPECT_EQ(commands_after(stats, 5), control::kSwitchVersion);
      EXPECT_LE(stats.peak_weight_versions, 2);
      for (const auto& r : stats.records) {
        if (r.action.kind != ActionKind::kForward && r.action.kind != ActionKind::kBackward) {
          continue;
        }
        const int64_t t = r.action.index / c.microbatches();
        const int64_t newest_from = t >= 6 ? 6 : t >= 4 ? 4 : t >= 3 ? 3 : 0;
        EXPECT_EQ(r.version, std::max<int64_t>({t - 1, newest_from, 0}))
            << schedule::ToString(r.action);
      }
    }

    // Stop before step 5: the result of a 5-step job.
    const JobReport stopped = run_with({{control::kStop, 5}});
    JobSpec five = c;
    five.set_steps(5);
    EXPECT_TRUE(BitwiseEqual(stopped.final_parameters, MustRun(five).final_parameters));
    for (const auto& stats : stopped.stage_stats) {
      ASSERT_EQ(stats.steps.size(), 5u);
      EXPECT_EQ(stats.steps.back().commands_after, control::kStop);
    }
  }
}

// Peak stashed micro-batches per rank, counted by the executor, equal the peak of its
// schedule's list (max over its prefixes of #F − #B; every kind whose backward is whole, its
// chunks together) and the rows of the table of docs/design.md section 3 (GPipe m, 1F1B
// min(p−s, m), 2BW p−s); one weight version under every kind that flushes.
TEST(Stash, PeakPerStageMatchesTheListsAndTheTable) {
  const int p = 4, m = 6;
  std::map<ScheduleKind, std::vector<int>> peaks;
  for (const ScheduleCase& k : EveryScheduleKind(p)) {
    if (schedule::SplitsBackward(k.kind))
      continue;  // its stash ends at W, which the list's peak does not count
    SCOPED_TRACE(schedule::ScheduleKindName(k.kind));
    JobSpec c = TinyGpt(k, m);
    c.set_steps(3);
    SetPrecision(c, pipetrain::job::Precision::kFloat32);
    JobReport report = MustRun(c);
    absl::StatusOr<std::vector<std::vector<schedule::Action>>> lists =
        schedule::BuildSchedule(ScheduleParamsOf(c, c.steps()));
    ASSERT_TRUE(lists.ok()) << lists.status();
    ASSERT_EQ(report.per_stage.size(), static_cast<size_t>(k.stages));
    for (int s = 0; s < k.stages; ++s) {
      const int peak = report.per_stage[s].peak_stashed_microbatches;
      EXPECT_EQ(peak, schedule::PeakInFlight((*lists)[s])) << "rank " << s;
      peaks[k.kind].push_back(peak);
      if (schedule::WeightsOf(k.kind) == schedule::WeightPolicy::kFlush) {
        EXPECT_EQ(report.per_stage[s].peak_weight_versions, 1) << "rank " << s;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(peaks[ScheduleKind::kGPipe].at(s), m);
    EXPECT_EQ(peaks[ScheduleKind::kOneFOneB].at(s), std::min(p - s, m));
    EXPECT_EQ(peaks[ScheduleKind::kTwoBW].at(s), p - s);
  }
}

// A wrong partition is rejected before anything runs, naming the layers.
TEST(Partition, GapOverlapAndOverrunAreErrorsNamingLayers) {
  JobSpec c = TinyGpt(ScheduleKind::kOneFOneB, 2, 2);
  SetStageRanges(c, {{0, 2}, {3, 6}});
  auto gap = RunInProcess(c);
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("layer 2 (block1) belong to no stage"), std::string::npos)
      << gap.status();
  SetStageRanges(c, {{0, 4}, {3, 7}});
  auto bad = RunInProcess(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 3 (block2) would be in both"), std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("runs past the last layer 5"), std::string::npos)
      << bad.status();
}

// The records a stage keeps are a window of the most recent ones (HistoryLimits); the
// totals still count every action, and the steps kept are the last ones, in order.
TEST(History, StageStatsKeepTheMostRecentRecordsOnly) {
  JobSpec c = TinyGpt(ScheduleKind::kTwoBW, 2, 2);
  c.set_steps(40);
  StagesRun run;
  RunStages(
      c,
      [](StageParts& parts) {
        parts.config.history = {/*actions=*/10, /*steps=*/5, /*allreduces=*/3};
      },
      run);
  ASSERT_EQ(run.results.size(), 2u);
  const auto& results = run.results;
  const auto& executors = run.executors;
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(results[s].ok()) << results[s];
    const executor::StageStats& st = executors[s]->stats();
    ASSERT_EQ(st.records.size(), 10u);
    ASSERT_EQ(st.steps.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(st.steps[i].step, 35 + static_cast<int64_t>(i));
    // The last kept action is the last STEP; the window's actions are consecutive.
    EXPECT_EQ(schedule::ToString(st.records.back().action), "STEP39");
    absl::StatusOr<std::vector<schedule::Action>> all =
        schedule::BuildStageSchedule({ScheduleKind::kTwoBW, 2, c.microbatches(), c.steps()}, s);
    ASSERT_TRUE(all.ok());
    for (size_t i = 0; i < 10; ++i) {
      EXPECT_EQ(st.records[i].action, (*all)[all->size() - 10 + i]) << "stage " << s;
    }
    // Totals cover every action, not only the window.
    double window = 0;
    for (const auto& r : st.records) window += r.end_s - r.start_s;
    EXPECT_GT(st.compute_s + st.wait_s, window);
  }
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
