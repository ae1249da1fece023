// Proof that pipelined training has the semantics docs/design.md section 4 claims, against
// independent references: the un-pipelined trainer with LibTorch's own optimizers
// (TrainReference), a whole-batch gradient, and hand-computed BatchNorm statistics.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/control/step_commands.h"
#include "runtime/data/dataset.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/job/plan.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "runtime/model/model_zoo.h"
#include "runtime/schedule/schedule.h"
#include "tests/pipeline/forwarding_transport.h"

namespace pipetrain::job {
namespace {

using schedule::ActionKind;
using schedule::ScheduleKind;

// A 2-block GPT (5 layers) small enough to train a few steps in well under a second.
JobConfig TinyGpt(ScheduleKind kind, int stages, int m) {
  JobConfig c;
  c.model.name = "gpt";
  c.model.d_model = 16;
  c.model.n_heads = 2;
  c.model.n_layers = 3;  // 6 layers: embedding, block0..2, final_norm, lm_head
  c.data.vocab = 16;
  c.data.seq_len = 8;
  c.data.num_tokens = 1 << 14;
  c.schedule = kind;
  c.stages = stages;
  c.micro_batches = m;
  c.micro_batch_size = 2;
  c.steps = 5;
  c.optimizer = {"sgd", 0.05};
  c.optimizer.momentum = 0.9;
  c.precision = pipetrain::job::Precision::kFloat64;
  c.threads_per_stage = 1;
  c.recv_timeout_s = 60;
  return c;
}

JobReport MustRun(const JobConfig& c) {
  auto report = RunInProcess(c);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : JobReport{};
}

std::vector<at::Tensor> MustReference(const JobConfig& c) {
  auto ref = TrainReference(c);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? *std::move(ref) : std::vector<at::Tensor>{};
}

bool BitwiseEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

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
  JobConfig c = TinyGpt(k.kind, k.stages, k.m);
  c.precision = k.float64 ? pipetrain::job::Precision::kFloat64 : pipetrain::job::Precision::kFloat32;
  c.recompute = *ParseRecompute(k.recompute);
  JobReport report = MustRun(c);
  auto reference = MustReference(c);
  ASSERT_EQ(report.final_parameters.size(), reference.size());
  const double diff = MaxRelativeDifference(report.final_parameters, reference);
  EXPECT_LE(diff, k.float64 ? 1e-10 : 1e-5);
  // The parameters moved: the comparison is not between two untouched initializations.
  JobConfig zero_steps = c;
  zero_steps.steps = 1;
  zero_steps.optimizer.lr = 1e-12;
  EXPECT_GT(MaxRelativeDifference(MustReference(zero_steps), reference), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, FlushEquivalence,
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
             std::to_string(info.param.stages) + "_m" + std::to_string(info.param.m) +
             "_recompute_" + recompute + (info.param.float64 ? "_float64" : "_float32");
    });

// Recomputation on vs off gives bitwise identical parameters, with dropout active.
TEST(Recompute, BitwiseEqualWithDropout) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kTwoBW}) {
    JobConfig c = TinyGpt(kind, 3, 4);
    c.precision = pipetrain::job::Precision::kFloat32;
    c.model.dropout = 0.2;
    c.optimizer = {"adamw", 1e-2};
    JobReport off = MustRun(c);
    c.recompute = *ParseRecompute("all");
    JobReport all = MustRun(c);
    c.recompute = *ParseRecompute("layers:0,2,3");
    JobReport some = MustRun(c);
    EXPECT_TRUE(BitwiseEqual(off.final_parameters, all.final_parameters))
        << schedule::ScheduleKindName(kind);
    EXPECT_TRUE(BitwiseEqual(off.final_parameters, some.final_parameters))
        << schedule::ScheduleKindName(kind);
    // Dropout really is active: another seed for the masks changes the result.
    c.seed += 1;
    JobReport other_seed = MustRun(c);
    EXPECT_FALSE(BitwiseEqual(off.final_parameters, other_seed.final_parameters));
  }
}

// Gradient accumulation over micro-batches equals the whole mini-batch gradient: one SGD
// step with lr 1 and no momentum moves the weights by exactly the whole-batch gradient.
TEST(MicroBatching, OneStepEqualsWholeBatchGradient) {
  JobConfig c = TinyGpt(ScheduleKind::kGPipe, 3, 4);
  c.steps = 1;
  c.optimizer = {"sgd", 1.0};
  c.optimizer.momentum = 0;
  JobReport report = MustRun(c);

  model::ModelConfig mc = c.model;
  mc.seed = c.seed;
  mc.float64 = true;
  mc.vocab_size = c.data.vocab;
  mc.seq_len = c.data.seq_len;
  auto layers = model::BuildModel(mc);
  ASSERT_TRUE(layers.ok());
  data::SyntheticCorpusOptions o;
  o.vocab = c.data.vocab;
  o.num_tokens = c.data.num_tokens;
  o.seed = c.data.seed;
  o.window.seq_len = c.data.seq_len;
  auto corpus = data::MakeSyntheticCorpus(o);
  ASSERT_TRUE(corpus.ok());
  data::BatchSampler sampler((*corpus)->num_samples(), c.seed, 1, c.micro_batches,
                             c.micro_batch_size);
  data::MicroBatch batch = (*corpus)->Read(sampler.GlobalBatchIds(0));
  at::Tensor x = torch::tensor(batch.input_tokens).reshape(batch.input_shape);
  at::Tensor y = torch::tensor(batch.targets).reshape(batch.target_shape);
  model::LayerContext ctx;
  ctx.seed = c.seed;
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
      JobConfig c = TinyGpt(ScheduleKind::kTwoBW, stages, m);
      c.optimizer.name = optimizer;
      if (std::string(optimizer) == "adamw") c.optimizer.lr = 1e-2;
      JobReport report = MustRun(c);
      auto reference = MustReference(c);
      SCOPED_TRACE(::testing::Message() << optimizer << " p=" << stages << " m=" << m);
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);

      // The delayed update really differs from the flushed one, so the check above can fail.
      JobConfig flushed = c;
      flushed.schedule = ScheduleKind::kOneFOneB;
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
      EXPECT_EQ(checked, 2 * stages * m * c.steps);
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
    JobConfig c = TinyGpt(ScheduleKind::kTwoBW, 3, 4);
    c.steps = 8;
    c.replicas = replicas;
    SCOPED_TRACE(::testing::Message() << "w=" << replicas);
    const JobReport plain = MustRun(c);
    auto run_with = [&](std::vector<std::pair<control::StepCommand, int64_t>> commands) {
      RunOptions options;
      options.commands = std::make_shared<control::StepCommandQueue>(c.steps);
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
        if (r.action.kind == ActionKind::kForward && r.action.index / c.micro_batches == 3) {
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
        const int64_t t = r.action.index / c.micro_batches;
        const int64_t newest_from = t >= 6 ? 6 : t >= 4 ? 4 : t >= 3 ? 3 : 0;
        EXPECT_EQ(r.version, std::max<int64_t>({t - 1, newest_from, 0}))
            << schedule::ToString(r.action);
      }
    }

    // Stop before step 5: the result of a 5-step job.
    const JobReport stopped = run_with({{control::kStop, 5}});
    JobConfig five = c;
    five.steps = 5;
    EXPECT_TRUE(BitwiseEqual(stopped.final_parameters, MustRun(five).final_parameters));
    for (const auto& stats : stopped.stage_stats) {
      ASSERT_EQ(stats.steps.size(), 5u);
      EXPECT_EQ(stats.steps.back().commands_after, control::kStop);
    }
  }
}

// Data-parallel replicas of the pipeline (stages and replicas as threads): the parameters
// equal the un-pipelined run over the whole global batch, for every schedule.
TEST(DataParallel, ReplicasEqualTheReferenceOnTheGlobalBatch) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kTwoBW}) {
    for (int replicas : {2, 3}) {
      JobConfig c = TinyGpt(kind, 3, 4);
      c.replicas = replicas;
      JobReport report = MustRun(c);
      SCOPED_TRACE(::testing::Message() << schedule::ScheduleKindName(kind) << " w=" << replicas);
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, MustReference(c)), 1e-10);
      // The replicas did read different data: one replica alone trains to other weights.
      JobConfig one = c;
      one.replicas = 1;
      EXPECT_GT(MaxRelativeDifference(MustReference(one), MustReference(c)), 1e-6);
      for (const auto& stage : report.per_stage) EXPECT_GT(stage.allreduce_s, 0.0);
    }
  }
}

// Hippie's communication schedule: stage 0 averages gradient buckets during its final
// backward, other stages right after their last backward. Same parameters as without
// overlap; every AllReduce starts after the backward that produces its gradients, and
// stages s > 0 start theirs before stage 0 ends its last backward.
TEST(DataParallel, OverlappedAllReduceTimingAndIdenticalParameters) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kTwoBW}) {
    JobConfig c = TinyGpt(kind, 2, 4);
    c.model.d_model = 64;
    c.model.n_heads = 4;
    c.micro_batch_size = 8;
    c.data.seq_len = 64;
    c.steps = 3;
    // Stage 0 holds all but the head, so its last backward lasts tens of milliseconds: the
    // wall-clock claims are about the schedule, not about how 4 stage threads share 2 cores.
    c.stage_ranges = {{0, 5}, {5, 6}};
    c.replicas = 2;
    c.bucket_kib = 64;  // several buckets
    c.overlap_allreduce = false;
    JobReport off = MustRun(c);
    c.overlap_allreduce = true;
    JobReport on = MustRun(c);
    SCOPED_TRACE(schedule::ScheduleKindName(kind));
    EXPECT_TRUE(BitwiseEqual(off.final_parameters, on.final_parameters));

    const int m = c.micro_batches;
    // Start and end of each stage's last backward of every step.
    auto last_backward = [&](const executor::StageStats& st, int64_t t) {
      for (auto it = st.records.rbegin(); it != st.records.rend(); ++it) {
        if (it->action.kind == ActionKind::kBackward && it->action.index == (t + 1) * m - 1) {
          return *it;
        }
      }
      ADD_FAILURE() << "no last backward for step " << t;
      return executor::ActionRecord{};
    };
    ASSERT_EQ(on.stage_stats.size(), static_cast<size_t>(c.stages * c.replicas));
    for (int r = 0; r < c.replicas; ++r) {
      SCOPED_TRACE(absl::StrCat("replica ", r));
      const auto& stage0 = on.stage_stats[r * c.stages];
      int buckets = 0;
      for (const auto& a : stage0.allreduces) {
        ASSERT_GE(a.bucket, 0);  // stage 0 reduces only in buckets
        const auto b = last_backward(stage0, a.step);
        EXPECT_GE(a.start_s, b.start_s);
        EXPECT_LE(a.start_s, b.end_s);
        ++buckets;
      }
      EXPECT_GT(buckets, c.steps);  // more than one bucket per step
      for (int s = 1; s < c.stages; ++s) {
        const auto& st = on.stage_stats[r * c.stages + s];
        ASSERT_EQ(st.allreduces.size(), static_cast<size_t>(c.steps));
        for (const auto& a : st.allreduces) {
          EXPECT_EQ(a.bucket, -1);
          EXPECT_GE(a.start_s, last_backward(st, a.step).end_s);
          // It starts within the stage's STEP that directly follows sending the gradient
          // of its last backward upstream, the gradient that stage 0's last backward needs...
          const auto& records = st.records;
          auto send = std::find_if(records.begin(), records.end(), [&](const auto& rec) {
            return rec.action == schedule::SendGrad((a.step + 1) * m - 1);
          });
          ASSERT_NE(send, records.end());
          ASSERT_NE(send + 1, records.end());
          EXPECT_EQ((send + 1)->action, schedule::Step(a.step));
          EXPECT_GE(a.start_s, (send + 1)->start_s);
          EXPECT_LE(a.end_s, (send + 1)->end_s);
          // ... and so, in wall-clock time, before stage 0 ends that backward: the
          // AllReduce of stage s overlaps the backward still running upstream.
          const double stage0_end = last_backward(stage0, a.step).end_s;
          EXPECT_LT(a.start_s, stage0_end) << "stage " << s << " step " << a.step
                                           << ": margin " << (stage0_end - a.start_s) * 1e3
                                           << " ms";
        }
      }
      // Without overlap, stage 0 reduces once per step, after its last backward.
      const auto& off_stage0 = off.stage_stats[r * c.stages];
      ASSERT_EQ(off_stage0.allreduces.size(), static_cast<size_t>(c.steps));
      for (const auto& a : off_stage0.allreduces) {
        EXPECT_EQ(a.bucket, -1);
        EXPECT_GE(a.start_s, last_backward(off_stage0, a.step).end_s);
      }
    }
    // Every AllReduce starts before the latest end of stage 0's last backward, so the
    // exposed part can be no longer than the AllReduce itself.
    EXPECT_GT(on.allreduce_s, 0.0);
    EXPECT_LE(on.exposed_allreduce_s, on.allreduce_s);
  }
}

// Peak stashed micro-batches per stage, counted by the executor, equal the table of docs/design.md section 3.
TEST(Stash, PeakPerStageMatchesTable) {
  const int p = 4, m = 6;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kTwoBW}) {
    JobConfig c = TinyGpt(kind, p, m);
    c.steps = 3;
    c.precision = pipetrain::job::Precision::kFloat32;
    JobReport report = MustRun(c);
    ASSERT_EQ(report.per_stage.size(), static_cast<size_t>(p));
    for (int s = 0; s < p; ++s) {
      const int expected = kind == ScheduleKind::kGPipe ? m : std::min(p - s, m);
      EXPECT_EQ(report.per_stage[s].peak_stashed_microbatches, expected)
          << schedule::ScheduleKindName(kind) << " stage " << s;
      if (kind != ScheduleKind::kTwoBW) {
        EXPECT_EQ(report.per_stage[s].peak_weight_versions, 1);
      }
    }
  }
}

// GPipe's micro-batch BatchNorm: each micro-batch is normalized with its own statistics,
// and the running statistics move once per mini-batch, by the statistics of all its
// micro-batches together.
TEST(BatchNorm, MicroBatchStatisticsAndOneRunningUpdatePerMiniBatch) {
  JobConfig c;
  c.model.name = "cnn";
  c.model.hidden = 4;
  c.model.hidden_layers = 2;
  c.model.image_shape = {2, 6, 6};
  c.model.num_classes = 3;
  c.data.num_samples = 256;
  c.schedule = ScheduleKind::kGPipe;
  c.stages = 2;
  c.micro_batches = 4;
  c.micro_batch_size = 3;
  c.steps = 1;
  c.optimizer = {"sgd", 0.1};
  c.precision = pipetrain::job::Precision::kFloat64;
  c.threads_per_stage = 1;
  JobReport report = MustRun(c);

  model::ModelConfig mc = c.model;
  mc.seed = c.seed;
  mc.float64 = true;
  auto layers = model::BuildModel(mc);
  ASSERT_TRUE(layers.ok());
  data::SyntheticClassificationOptions o;
  o.sample_shape = c.model.image_shape;
  o.num_classes = 3;
  o.num_samples = c.data.num_samples;
  o.seed = c.data.seed;
  auto dataset = data::MakeSyntheticClassification(o);
  ASSERT_TRUE(dataset.ok());
  data::BatchSampler sampler((*dataset)->num_samples(), c.seed, 1, 4, 3);
  auto to_tensor = [](const data::MicroBatch& mb) {
    return torch::tensor(mb.input_values).reshape(mb.input_shape).to(at::kDouble);
  };
  at::Tensor conv_w = (*layers)[0]->Parameters()[0];
  ASSERT_EQ(conv_w.dim(), 4);
  // Statistics of conv0's output over the whole mini-batch (unbiased variance).
  at::Tensor whole = at::conv2d(to_tensor((*dataset)->Read(sampler.GlobalBatchIds(0))), conv_w,
                                {}, 1, 1).detach();
  at::Tensor mean = whole.mean({0, 2, 3});
  at::Tensor var = whole.var({0, 2, 3}, /*unbiased=*/true);
  // Buffers of conv0 come first: running_mean, running_var (initially 0 and 1).
  ASSERT_GE(report.final_buffers.size(), 2u);
  EXPECT_TRUE(at::allclose(report.final_buffers[0], 0.1 * mean, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(report.final_buffers[1], 0.9 + 0.1 * var, 1e-12, 1e-12));

  // Training-mode output of one micro-batch uses that micro-batch's own statistics.
  at::Tensor x0 = to_tensor((*dataset)->Read(sampler.SampleIds(0, 0, 0)));
  model::LayerContext ctx;
  ctx.recomputing = true;  // do not count this probe
  at::Tensor out = (*layers)[0]->Forward(x0, ctx).detach();
  at::Tensor y0 = at::conv2d(x0, conv_w, {}, 1, 1).detach();
  at::Tensor mb_mean = y0.mean({0, 2, 3}, true), mb_var = y0.var({0, 2, 3}, false, true);
  at::Tensor manual = at::relu((y0 - mb_mean) / at::sqrt(mb_var + 1e-5));
  EXPECT_TRUE(at::allclose(out, manual, 1e-9, 1e-9));
  EXPECT_FALSE(at::allclose(mb_mean.flatten(), mean, 1e-3, 1e-3));  // micro != mini stats
}

// A VGG-11 (conv3x3 + BatchNorm + ReLU, max pooling at the end of each stage) on 32x32
// images, cut into 3 pipeline stages under 1F1B, float64, with 1 and with 2 replicas: its
// parameters after 3 steps equal the un-pipelined run over the same global batch.
TEST(Vgg, PipelinedAndReplicatedEqualTheReference) {
  JobConfig c;
  c.model.name = "vgg";
  c.model.hidden = 2;
  c.model.hidden_layers = 11;
  c.model.image_shape = {3, 32, 32};
  c.model.num_classes = 4;
  c.data.num_samples = 256;
  c.schedule = ScheduleKind::kOneFOneB;
  c.stages = 3;
  c.micro_batches = 3;
  c.micro_batch_size = 4;
  c.steps = 3;
  c.optimizer = {"sgd", 0.05};
  c.precision = pipetrain::job::Precision::kFloat64;
  c.threads_per_stage = 1;
  for (int replicas : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << replicas << " replicas");
    c.replicas = replicas;
    JobReport report = MustRun(c);
    auto reference = MustReference(c);
    ASSERT_EQ(report.final_parameters.size(), reference.size());
    EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
    JobConfig untrained = c;
    untrained.optimizer.lr = 1e-12;
    EXPECT_GT(MaxRelativeDifference(MustReference(untrained), reference), 1e-4);
  }
}

// A wrong partition is rejected before anything runs, naming the layers.
TEST(Partition, GapOverlapAndOverrunAreErrorsNamingLayers) {
  JobConfig c = TinyGpt(ScheduleKind::kOneFOneB, 2, 2);
  c.stage_ranges = {{0, 2}, {3, 6}};
  auto gap = RunInProcess(c);
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("layer 2 (block1) belong to no stage"), std::string::npos)
      << gap.status();
  c.stage_ranges = {{0, 4}, {3, 7}};
  auto bad = RunInProcess(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("layer 3 (block2) would be in both"), std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("runs past the last layer 5"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace pipetrain::job

namespace pipetrain::job {
namespace {

// A model brought from Python: a TorchScript archive of an nn.Sequential (built here with
// the TorchScript compiler so the test needs no Python), including dropout.
std::string SaveScriptedSequential(const std::string& path) {
  torch::manual_seed(7);
  torch::jit::Module root("Sequential");
  root.register_attribute("training", c10::BoolType::get(), true);
  auto linear = [](const char* type, int64_t in, int64_t out, bool relu) {
    torch::jit::Module m(type);
    m.register_attribute("training", c10::BoolType::get(), true);
    m.register_parameter("weight", torch::randn({out, in}) / std::sqrt(double(in)), false);
    m.register_parameter("bias", torch::zeros({out}), false);
    m.define(std::string("def forward(self, x):\n  y = torch.matmul(x, self.weight.t()) + self.bias"
                         "\n  return ") + (relu ? "torch.relu(y)\n" : "y\n"));
    return m;
  };
  torch::jit::Module dropout("Dropout");
  dropout.register_attribute("training", c10::BoolType::get(), true);
  dropout.define("def forward(self, x):\n  return torch.dropout(x, 0.3, self.training)\n");
  root.register_module("0", linear("L0", 32, 24, true));
  root.register_module("1", dropout);
  root.register_module("2", linear("L1", 24, 24, true));
  root.register_module("3", linear("L2", 24, 10, false));
  root.save(path);
  return path;
}

JobConfig ScriptJob(const std::string& path) {
  JobConfig c;
  c.model.name = "torchscript";
  c.model.torchscript_path = path;
  c.data.kind = "classification";
  c.data.num_samples = 1024;
  c.schedule = ScheduleKind::kOneFOneB;
  c.stage_ranges = {{0, 2}, {2, 3}, {3, 4}};
  c.stages = 3;
  c.micro_batches = 4;
  c.micro_batch_size = 4;
  c.steps = 5;
  c.optimizer = {"adamw", 1e-2};
  c.threads_per_stage = 1;
  return c;
}

TEST(TorchScript, SequentialChildrenAreLayersAndTrainExactly) {
  const std::string path = SaveScriptedSequential(::testing::TempDir() + "/seq.pt");
  JobConfig c = ScriptJob(path);
  JobReport report = MustRun(c);
  EXPECT_EQ(report.model_summary.rfind("torchscript: 4 layers", 0), 0u) << report.model_summary;
  auto reference = MustReference(c);
  EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-5);
  EXPECT_GT(report.losses.front(), report.losses.back());
  // Dropout inside TorchScript is replayed exactly under recomputation.
  c.recompute = *ParseRecompute("all");
  JobReport recomputed = MustRun(c);
  EXPECT_TRUE(BitwiseEqual(report.final_parameters, recomputed.final_parameters));
}

TEST(TorchScript, UnreadableFileIsAClearError) {
  JobConfig c = ScriptJob(::testing::TempDir() + "/does_not_exist.pt");
  auto report = RunInProcess(c);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(report.status().message().find("does_not_exist.pt"), std::string::npos);
}

// Fault injection by wrapping the real transport: corrupts or drops one message.
class FaultyTransport : public ForwardingTransport {
 public:
  enum class Fault { kWrongShape, kWrongDtype, kDrop };
  FaultyTransport(std::unique_ptr<transport::Transport> inner, Fault fault, int64_t micro_batch)
      : ForwardingTransport(std::move(inner)), fault_(fault), micro_batch_(micro_batch) {}
  absl::Status SendMessage(int peer, transport::MessageKind kind, int64_t j,
                           const at::Tensor& t) override {
    if (kind != transport::MessageKind::kActivation || j != micro_batch_) {
      return inner_->Send(peer, kind, j, t);
    }
    switch (fault_) {
      case Fault::kWrongShape:
        return inner_->Send(peer, kind, j, at::cat({t, t.narrow(-1, 0, 1)}, -1));
      case Fault::kWrongDtype:
        return inner_->Send(peer, kind, j, t.to(at::kFloat));
      case Fault::kDrop:
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  Fault fault_;
  int64_t micro_batch_;
};

absl::StatusOr<JobReport> RunWithFault(FaultyTransport::Fault fault, double timeout_s) {
  JobConfig c = TinyGpt(ScheduleKind::kOneFOneB, 3, 4);
  c.recv_timeout_s = timeout_s;
  RunOptions options;
  options.wrap_transport = [fault](std::unique_ptr<transport::Transport> t, int stage) {
    if (stage != 1) return t;
    return std::unique_ptr<transport::Transport>(
        new FaultyTransport(std::move(t), fault, /*micro_batch=*/6));
  };
  return RunInProcess(c, options);
}

TEST(CheckedMessages, WrongShapeNamesStageMicroBatchExpectedAndActual) {
  auto report = RunWithFault(FaultyTransport::Fault::kWrongShape, 60);
  ASSERT_FALSE(report.ok());
  const std::string message(report.status().message());
  EXPECT_EQ(message.substr(0, message.find(" [stopped at:")),
            "stage 2 RECV_ACT6: activation of micro-batch 6 from stage 1 has the wrong shape "
            "or dtype: expected float64[2, 8, 16], got float64[2, 8, 17]");
  // Where every stage was when the job stopped: stage 2 at the bad message, the others at a
  // wait that the abort cut short.
  EXPECT_NE(message.find("stopped at: stage 0 "), std::string::npos) << message;
  EXPECT_NE(message.find("stage 2 RECV_ACT6]"), std::string::npos) << message;
}

TEST(CheckedMessages, WrongDtypeIsRejected) {
  auto report = RunWithFault(FaultyTransport::Fault::kWrongDtype, 60);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("expected float64[2, 8, 16], got float32[2, 8, 16]"),
            std::string::npos)
      << report.status();
}

TEST(Watchdog, LostMessageFailsEveryStageWithinTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  auto report = RunWithFault(FaultyTransport::Fault::kDrop, 1.0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDeadlineExceeded);
  // Stage 2 waits for the lost activation while stages 1 and 0 wait for gradients that
  // cannot come; whichever deadline passes first is the error, and where every stage stopped
  // points at the lost message.
  const std::string message(report.status().message());
  EXPECT_NE(message.find(" timed out waiting for the "), std::string::npos) << message;
  EXPECT_NE(message.find("stage 2 RECV_ACT6"), std::string::npos) << message;
  EXPECT_LT(seconds, 5.0);
}

// A one-stage job never waits for a peer, so aborting its transport alone would not stop it:
// Stop() does, before the next action, with the reason given.
TEST(Stop, EndsAStageThatNeverWaitsForAPeer) {
  JobConfig c = TinyGpt(ScheduleKind::kOneFOneB, 1, 1);
  c.steps = 1000000;  // far more than run before the stop
  absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  MicroBatchReader reader(*plan, c.micro_batches);
  absl::StatusOr<StageParts> parts = BuildStage(c, *plan, reader, 0);
  ASSERT_TRUE(parts.ok()) << parts.status();
  auto hub = transport::MakeInProcessHub();
  std::unique_ptr<transport::Transport> transport = transport::MakeInProcessTransport(hub, 0, 0, 1);
  std::atomic<int64_t> steps_done{0};
  executor::StageExecutor executor(parts->config, parts->weights.get(), transport.get(),
                                   [&](const executor::StepRecord&) { ++steps_done; });
  absl::Status result;
  std::thread stage([&] { result = executor.Run(); });
  while (steps_done < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto stopped = std::chrono::steady_clock::now();
  executor.Stop(absl::CancelledError("the coordinator ended the job"));
  stage.join();
  EXPECT_LT(std::chrono::steady_clock::now() - stopped, std::chrono::seconds(1));
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(result.message(), "the coordinator ended the job");
  EXPECT_TRUE(executor.stopped_at().has_value());
  EXPECT_LT(steps_done.load(), 1000000);
}

// The records a stage keeps are a window of the most recent ones (HistoryLimits); the
// totals still count every action, and the steps kept are the last ones, in order.
TEST(History, StageStatsKeepTheMostRecentRecordsOnly) {
  JobConfig c = TinyGpt(ScheduleKind::kTwoBW, 2, 2);
  c.steps = 40;
  absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  MicroBatchReader reader(*plan, c.micro_batches);
  auto hub = transport::MakeInProcessHub();
  std::vector<StageParts> parts;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<executor::StageExecutor>> executors;
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<StageParts> built = BuildStage(c, *plan, reader, s);
    ASSERT_TRUE(built.ok()) << built.status();
    parts.push_back(std::move(*built));
    parts.back().config.history = {/*actions=*/10, /*steps=*/5, /*allreduces=*/3};
    transports.push_back(transport::MakeInProcessTransport(hub, s, 0, 1));
    executors.push_back(std::make_unique<executor::StageExecutor>(
        parts.back().config, parts.back().weights.get(), transports.back().get()));
  }
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) threads.emplace_back([&, s] { results[s] = executors[s]->Run(); });
  for (auto& t : threads) t.join();
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(results[s].ok()) << results[s];
    const executor::StageStats& st = executors[s]->stats();
    ASSERT_EQ(st.records.size(), 10u);
    ASSERT_EQ(st.steps.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(st.steps[i].step, 35 + static_cast<int64_t>(i));
    // The last kept action is the last STEP; the window's actions are consecutive.
    EXPECT_EQ(schedule::ToString(st.records.back().action), "STEP39");
    absl::StatusOr<std::vector<schedule::Action>> all = schedule::BuildStageSchedule(
        {ScheduleKind::kTwoBW, 2, c.micro_batches, c.steps}, s);
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
}  // namespace pipetrain::job
