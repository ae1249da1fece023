// Non-finite steps (stages as threads, 2 ranks x 2 replicas, float64, AdamW; under every kind
// of schedule, pipeline_test::EveryScheduleKind, m = 4 where a kind needs more than 2): a NaN put
// into one replica's activations at step s makes its loss NaN; every rank of both replicas skips
// step s together, so the weights, BatchNorm statistics and optimizer state after step s are
// bitwise those before it (compared through the checkpoints of the two boundaries); the skip is
// counted; nonfinite_limit consecutive skips fail the job with a clear error.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/plan.h"
#include "runtime/schedule/chunked_schedule.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "runtime/weights/weight_store.h"
#include "tests/pipeline/forwarding_transport.h"
#include "tests/pipeline/schedule_cases.h"

namespace pipetrain::job {
namespace {

namespace fs = std::filesystem;
using pipeline_test::ScheduleCase;
using schedule::ScheduleKind;
using ::testing::HasSubstr;

// 5 layers (embedding, 2 blocks, final norm, head) on k's 2 ranks (of 2 chunks under the
// kinds with chunks), 2 micro-batches a step where k's kind takes them, else 4.
JobSpec Gpt(const ScheduleCase& k, int steps) {
  JobSpec c;
  c.mutable_model()->set_name("gpt");
  c.mutable_model()->set_d_model(16);
  c.mutable_model()->set_n_heads(2);
  c.mutable_model()->set_n_layers(2);
  c.mutable_data()->set_vocab(16);
  c.mutable_data()->set_seq_len(8);
  c.mutable_data()->set_num_tokens(1 << 14);
  SetSchedule(c, k.kind);
  c.set_stages(k.stages);
  c.set_virtual_stages(k.virtual_stages);
  c.set_replicas(2);
  c.set_microbatches(pipeline_test::TakesLayout(k.kind, k.stages, k.virtual_stages, 2) ? 2 : 4);
  c.set_microbatch_size(2);
  c.set_steps(steps);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("adamw");
  c.mutable_optimizer()->set_lr(1e-2);
  SetPrecision(c, pipetrain::job::Precision::kFloat64);
  c.set_threads_per_stage(1);
  c.set_timeout_s(60);
  return c;
}

// 1F1B: the tests that are about the skip's accounting, not the schedule.
JobSpec Gpt(int steps) { return Gpt({ScheduleKind::kOneFOneB, 2, 0}, steps); }

fs::path TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("pipetrain_nonfinite_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

// Rank 0 of replica 0 sends NaN activations for the micro-batches of `steps`.
class PoisoningTransport : public ForwardingTransport {
 public:
  PoisoningTransport(std::unique_ptr<transport::Transport> inner, schedule::ChunkLayout layout,
                     int micro_batches, std::set<int64_t> steps)
      : ForwardingTransport(std::move(inner)),
        layout_(layout),
        m_(micro_batches),
        steps_(std::move(steps)) {}
  absl::Status SendMessage(int peer, transport::MessageKind kind, int64_t number,
                           const at::Tensor& t) override {
    if (kind == transport::MessageKind::kActivation &&
        steps_.count(layout_.MicroBatchOfMessage(number) / m_)) {
      return inner_->Send(peer, kind, number, at::full_like(t, std::nan("")));
    }
    return inner_->Send(peer, kind, number, t);
  }

 private:
  schedule::ChunkLayout layout_;
  int m_;
  std::set<int64_t> steps_;
};

RunOptions Poison(const JobSpec& c, std::set<int64_t> steps) {
  RunOptions options;
  auto stage0_calls = std::make_shared<int>(0);
  options.wrap_transport = [m = c.microbatches(),
                            layout = schedule::LayoutOf(ScheduleParamsOf(c, c.steps())), steps,
                            stage0_calls](std::unique_ptr<transport::Transport> t, int stage) {
    // Stages are built replica by replica: the first stage 0 is replica 0's.
    if (stage != 0 || (*stage0_calls)++ != 0) return t;
    return std::unique_ptr<transport::Transport>(
        new PoisoningTransport(std::move(t), layout, m, steps));
  };
  return options;
}

// Every tensor of the checkpoint of `step` under `root`: parameters, buffers and optimizer
// state (not `latest`: that is the job's final checkpoint).
std::vector<at::Tensor> CheckpointTensors(const fs::path& root, int64_t step) {
  std::vector<at::Tensor> out;
  auto found = checkpoint::FindCheckpoint((root / checkpoint::StepDirName(step)).string());
  EXPECT_TRUE(found.ok()) << found.status();
  if (!found.ok()) return out;
  EXPECT_EQ(found->manifest.step, step);
  for (int layer = 0; layer < found->manifest.num_layers; ++layer) {
    auto state = checkpoint::ParseLayerState(*checkpoint::ReadLayer(*found, layer));
    EXPECT_TRUE(state.ok()) << state.status();
    if (!state.ok()) continue;
    out.insert(out.end(), state->parameters.begin(), state->parameters.end());
    out.insert(out.end(), state->buffers.begin(), state->buffers.end());
    for (const weights::ParameterState& p : state->optimizer) {
      for (const auto& [name, tensor] : p) out.push_back(tensor);
    }
  }
  return out;
}

class NonFiniteTest : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(NonFiniteTest, AStepWithANaNLossIsSkippedOnEveryRankAndLeavesEverythingUnchanged) {
  constexpr int64_t kPoisoned = 4;
  // Clean, checkpoint before step 4 (W(4), the optimizer after 4 updates).
  const fs::path before = TempDir("before"), after = TempDir("after");
  JobSpec clean = Gpt(GetParam(), 5);
  clean.mutable_checkpoint()->set_dir(before.string());
  clean.mutable_checkpoint()->set_every(kPoisoned);
  ASSERT_TRUE(RunInProcess(clean).ok());
  // Step 4 poisoned on replica 0 only, checkpoint before step 5.
  JobSpec poisoned = Gpt(GetParam(), 7);
  poisoned.mutable_checkpoint()->set_dir(after.string());
  poisoned.mutable_checkpoint()->set_every(kPoisoned + 1);
  absl::StatusOr<JobReport> report = RunInProcess(poisoned, Poison(poisoned, {kPoisoned}));
  ASSERT_TRUE(report.ok()) << report.status();
  // Every rank of both replicas skipped exactly that step.
  ASSERT_EQ(report->stage_stats.size(), 4u);
  for (const executor::StageStats& st : report->stage_stats) {
    EXPECT_EQ(st.skipped_steps, 1);
    for (const executor::StepRecord& step : st.steps) {
      EXPECT_EQ(step.skipped, step.step == kPoisoned) << "step " << step.step;
    }
  }
  ASSERT_EQ(report->losses.size(), 7u);
  for (int64_t t = 0; t < 7; ++t) {
    EXPECT_EQ(std::isnan(report->losses[t]), t == kPoisoned) << "step " << t;
  }
  // W(5) = W(4) and the optimizer state after step 4 is that after step 3, bitwise.
  const std::vector<at::Tensor> a = CheckpointTensors(before, kPoisoned);
  const std::vector<at::Tensor> b = CheckpointTensors(after, kPoisoned + 1);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(at::equal(a[k], b[k])) << "tensor " << k;
  // ...and training goes on afterwards with finite weights.
  for (const at::Tensor& t : report->final_parameters) {
    EXPECT_TRUE(at::isfinite(t).all().item<bool>());
  }
  fs::remove_all(before);
  fs::remove_all(after);
}

INSTANTIATE_TEST_SUITE_P(Schedules, NonFiniteTest,
                         ::testing::ValuesIn(pipeline_test::EveryScheduleKind(2)),
                         pipeline_test::CaseName);

// The check every update makes, against ATen's isfinite: each of NaN, +inf and -inf anywhere
// in a float32 or float64 gradient, contiguous or not, or in a dtype read through ATen.
TEST(NonFinite, AllFiniteFindsEveryKindOfNonFiniteValueAnywhere) {
  const double bad[] = {std::numeric_limits<double>::quiet_NaN(),
                        std::numeric_limits<double>::infinity(),
                        -std::numeric_limits<double>::infinity()};
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf}) {
    for (int64_t at_index : {int64_t{0}, int64_t{37}, int64_t{999}}) {
      for (double value : bad) {
        at::Tensor finite = at::randn({1000}).to(dtype);
        at::Tensor grad = at::randn({1000}).to(dtype);
        grad[at_index] = value;
        EXPECT_TRUE(weights::AllFinite({finite}));
        EXPECT_FALSE(weights::AllFinite({finite, grad}))
            << at::toString(dtype) << " " << value << " at " << at_index;
        EXPECT_FALSE(weights::AllFinite({grad.reshape({10, 100}).t()}));  // not contiguous
      }
    }
  }
  // Large finite values are finite; undefined and empty tensors have nothing to check.
  EXPECT_TRUE(weights::AllFinite(
      {at::full({5}, 3e38f), at::full({5}, 1e308, at::kDouble), at::Tensor(), at::empty({0})}));
}

TEST(NonFinite, LimitConsecutiveSkipsFailTheJobNamingTheSteps) {
  JobSpec c = Gpt(8);
  c.set_nonfinite_limit(3);
  absl::StatusOr<JobReport> failed = RunInProcess(c, Poison(c, {2, 3, 4}));
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(),
              HasSubstr("the loss or the gradients were not finite in 3 consecutive steps (2 "
                        "to 4; each was skipped)"));
  EXPECT_THAT(failed.status().message(), HasSubstr("nonfinite_limit 3"));
  // Two in a row, then a good step, then one more: skipped, counted, and the job succeeds.
  absl::StatusOr<JobReport> ok = RunInProcess(c, Poison(c, {2, 3, 5}));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->stage_stats[0].skipped_steps, 3);
}

// A run that goes on after a restart counts the steps skipped in a row right before its
// first (Generation::skipped_in_a_row, from the coordinator): resumed at step 4 after steps 2
// and 3 were skipped, one more skip reaches nonfinite_limit 3 and names steps 2 to 4. The
// step that reaches the limit is reported before the run fails, so the steps reported
// skipped are the steps the failure names (a coordinator once counted 2 where 3 were named).
// Negative control: without the count, the same run goes on.
TEST(NonFinite, StepsSkippedBeforeARestartCountTowardTheLimitAndTheLastIsReported) {
  const fs::path ckpt = TempDir("streak");
  JobSpec first = Gpt(4);
  first.mutable_checkpoint()->set_dir(ckpt.string());
  first.mutable_checkpoint()->set_every(4);
  ASSERT_TRUE(RunInProcess(first).ok());
  JobSpec resumed = Gpt(8);
  resumed.mutable_checkpoint()->set_dir(ckpt.string());
  resumed.set_resume_from("latest");
  resumed.set_nonfinite_limit(3);
  RunOptions after_two = Poison(resumed, {4});
  after_two.generation.skipped_in_a_row = 2;
  absl::StatusOr<JobReport> failed = RunInProcess(resumed, after_two);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(),
              HasSubstr("not finite in 3 consecutive steps (2 to 4; each was skipped)"));
  absl::StatusOr<JobReport> goes_on = RunInProcess(resumed, Poison(resumed, {4}));
  EXPECT_TRUE(goes_on.ok()) << goes_on.status();
  fs::remove_all(ckpt);

  // A rank reports the step that reaches the limit (its on_step, which feeds the
  // coordinator's step reports) before its Run() fails: one rank alone (another could stop
  // it first by its own failure), a CNN whose inputs of step 0 are NaN, after 2 skipped in a
  // row.
  JobSpec c = Gpt(3);
  c.clear_model();
  c.mutable_model()->set_name("cnn");
  c.mutable_model()->set_hidden(4);
  c.mutable_model()->set_hidden_layers(2);
  c.mutable_model()->clear_image_shape();
  for (int64_t d : {1, 4, 4}) c.mutable_model()->add_image_shape(d);
  c.mutable_model()->set_num_classes(3);
  c.clear_data();
  c.mutable_data()->set_kind("classification");
  c.mutable_data()->set_num_samples(64);
  c.set_stages(1);
  c.set_replicas(1);
  c.set_nonfinite_limit(3);
  absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  MicroBatchReader reader(*plan, c.microbatches());
  StageStart start;
  start.generation.skipped_in_a_row = 2;
  absl::StatusOr<StageParts> parts = BuildStage(c, *plan, reader, 0, start);
  ASSERT_TRUE(parts.ok()) << parts.status();
  const executor::MicroBatchTensorSource inputs = parts->config.inputs;
  parts->config.inputs = [inputs, m = c.microbatches()](int64_t j) -> absl::StatusOr<at::Tensor> {
    absl::StatusOr<at::Tensor> x = inputs(j);
    if (x.ok() && j < m) return at::full_like(*x, std::nan(""));
    return x;
  };
  auto hub = transport::MakeInProcessHub();
  std::unique_ptr<transport::Transport> transport =
      transport::MakeInProcessTransport(hub, 0, 1, 0, 1);
  std::vector<int64_t> skipped_reported;
  executor::StageExecutor executor(parts->config, parts->weight_stores(), transport.get(),
                                   [&](const executor::StepRecord& step) {
                                     if (step.skipped) skipped_reported.push_back(step.step);
                                   });
  const absl::Status result = executor.Run();
  EXPECT_THAT(result.message(), HasSubstr("not finite in 3 consecutive steps"));
  EXPECT_THAT(skipped_reported, ::testing::ElementsAre(0));
}

}  // namespace
}  // namespace pipetrain::job
