// Checkpoints keyed by layer, taken by the policy, and jobs resumed from them in this process
// (stages as threads), under every kind of schedule (pipeline_test::EveryScheduleKind): a job
// that dies after its checkpoint at step 10 and is resumed ends bitwise equal to the job that
// never died, its losses too; a checkpoint of 4 stages (2 ranks of 2 chunks) resumes on other
// layouts (fewer stages, more replicas) within 1e-10 (float64, dropout masks following their
// samples); a job that ends writes its final checkpoint, which a longer job resumes from
// (named by the `latest` pointer file itself) and continues as the uninterrupted reference.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/checkpoint/checkpoint_dir.h"
#include "runtime/job/launch/in_process.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/schedule/chunked_schedule.h"
#include "tests/pipeline/forwarding_transport.h"
#include "tests/pipeline/schedule_cases.h"

namespace pipetrain::job {
namespace {

namespace fs = std::filesystem;
using pipeline_test::EveryScheduleKind;
using pipeline_test::ScheduleCase;
using schedule::ScheduleKind;
using ::testing::HasSubstr;

// 6 layers (embedding, 3 blocks, final norm, head), float64, AdamW (state that must move
// with its layer), dropout (masks that must follow their samples onto another layout), on
// k's layout (4 stages, or 2 ranks of 2 chunks).
JobSpec Gpt(const ScheduleCase& k, const std::string& dir) {
  JobSpec c;
  c.mutable_model()->set_name("gpt");
  c.mutable_model()->set_d_model(16);
  c.mutable_model()->set_n_heads(2);
  c.mutable_model()->set_n_layers(3);
  c.mutable_model()->set_dropout(0.1);
  c.mutable_data()->set_vocab(16);
  c.mutable_data()->set_seq_len(8);
  c.mutable_data()->set_num_tokens(1 << 14);
  SetSchedule(c, k.kind);
  c.set_stages(k.stages);
  c.set_virtual_stages(k.virtual_stages);
  c.set_microbatches(4);
  c.set_microbatch_size(2);
  c.set_steps(20);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("adamw");
  c.mutable_optimizer()->set_lr(1e-2);
  SetPrecision(c, pipetrain::job::Precision::kFloat64);
  c.set_threads_per_stage(1);
  c.set_timeout_s(60);
  c.mutable_checkpoint()->set_dir(dir);
  c.mutable_checkpoint()->set_every(10);
  return c;
}

// 1F1B on 4 stages: the tests that are about the checkpoint, not the schedule.
JobSpec Gpt(const std::string& dir) { return Gpt({ScheduleKind::kOneFOneB, 4, 0}, dir); }

fs::path TempDir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("pipetrain_resume_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

// Fails rank 1's send of one micro-batch's activation: the job dies there (every stage stops).
class CrashingTransport : public ForwardingTransport {
 public:
  CrashingTransport(std::unique_ptr<transport::Transport> inner, schedule::ChunkLayout layout,
                    int64_t micro_batch)
      : ForwardingTransport(std::move(inner)), layout_(layout), micro_batch_(micro_batch) {}
  absl::Status SendMessage(int peer, transport::MessageKind kind, int64_t number,
                           const at::Tensor& t) override {
    if (kind == transport::MessageKind::kActivation &&
        layout_.MicroBatchOfMessage(number) == micro_batch_) {
      return absl::UnavailableError("injected crash");
    }
    return inner_->Send(peer, kind, number, t);
  }

 private:
  schedule::ChunkLayout layout_;
  int64_t micro_batch_;
};

JobReport MustRun(const JobSpec& c, const RunOptions& options = {}) {
  absl::StatusOr<JobReport> report = RunInProcess(c, options);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : JobReport{};
}

void ExpectBitwiseEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(at::equal(a[k], b[k])) << "tensor " << k;
}

class ResumeTest : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(ResumeTest, AJobKilledAfterItsCheckpointResumesBitwiseEqual) {
  const fs::path whole_dir = TempDir("whole"), crash_dir = TempDir("crash");
  const JobSpec whole = Gpt(GetParam(), whole_dir.string());
  const JobReport uninterrupted = MustRun(whole);
  ASSERT_EQ(uninterrupted.losses.size(), 20u);

  // The same job, dead in step 13 (after its checkpoint before step 10 was committed).
  JobSpec crashing = Gpt(GetParam(), crash_dir.string());
  RunOptions options;
  options.wrap_transport = [m = crashing.microbatches(),
                            layout =
                                schedule::LayoutOf(ScheduleParamsOf(crashing, crashing.steps()))](
                               std::unique_ptr<transport::Transport> t, int rank) {
    if (rank != 1) return t;
    return std::unique_ptr<transport::Transport>(
        new CrashingTransport(std::move(t), layout, 13 * m + 1));
  };
  absl::StatusOr<JobReport> died = RunInProcess(crashing, options);
  ASSERT_FALSE(died.ok());
  EXPECT_THAT(died.status().message(), HasSubstr("injected crash"));
  auto found = checkpoint::FindCheckpoint(crash_dir.string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 10);
  EXPECT_EQ(found->manifest.num_layers, 6);

  JobSpec resumed = crashing;
  resumed.set_resume_from("latest");
  const JobReport finished = MustRun(resumed);
  EXPECT_EQ(finished.first_step, 10);
  ExpectBitwiseEqual(finished.final_parameters, uninterrupted.final_parameters);
  ExpectBitwiseEqual(finished.final_buffers, uninterrupted.final_buffers);
  ASSERT_EQ(finished.losses.size(), 10u);
  for (int t = 10; t < 20; ++t) {
    EXPECT_EQ(finished.losses[t - 10], uninterrupted.losses[t]) << "step " << t;
  }
  fs::remove_all(whole_dir);
  fs::remove_all(crash_dir);
}

// Resumed elsewhere: on another layout, or as a longer job. Under every kind but those that
// stash weights (pipedream: its updates depend on the pipeline's depth, and its drain at a
// checkpoint starts every stage on its newest version, so no other layout and no longer job
// without the drain computes what it does; docs/checkpoints.md).
class ResumeElsewhereTest : public ResumeTest {};

std::vector<ScheduleCase> KindsThatResumeElsewhere() {
  std::vector<ScheduleCase> cases;
  for (const ScheduleCase& k : EveryScheduleKind(4)) {
    if (schedule::WeightsOf(k.kind) != schedule::WeightPolicy::kStashed) cases.push_back(k);
  }
  return cases;
}

// The layers regroup: 4 stages x 1 replica (m = 4; or 2 ranks of 2 chunks) resume as
// 2 ranks x 2 replicas (m = 2, the same global batch), as 1 rank, and as 1 rank x 2 replicas,
// each where the kind takes that layout (at least two of them); the optimizer state moves
// with its layer.
TEST_P(ResumeElsewhereTest, ACheckpointResumesOnAnotherLayoutWithin1e10) {
  const fs::path dir = TempDir("layouts");
  JobSpec whole = Gpt(GetParam(), dir.string());
  const JobReport uninterrupted = MustRun(whole);
  int layouts = 0;
  for (auto [stages, replicas, m] :
       {std::tuple{2, 2, 2}, std::tuple{1, 1, 4}, std::tuple{1, 2, 2}}) {
    if (!pipeline_test::TakesLayout(ScheduleOf(whole), stages, whole.virtual_stages(), m)) continue;
    ++layouts;
    SCOPED_TRACE(testing::Message() << stages << " ranks x " << replicas << " replicas");
    JobSpec other = whole;
    other.set_stages(stages);
    other.set_replicas(replicas);
    other.set_microbatches(m);
    other.mutable_checkpoint()->set_every(0);  // keep the checkpoint of step 10 the latest
    other.set_resume_from((dir / checkpoint::StepDirName(10)).string());
    const JobReport finished = MustRun(other);
    EXPECT_EQ(finished.first_step, 10);
    EXPECT_LE(MaxRelativeDifference(finished.final_parameters, uninterrupted.final_parameters),
              1e-10);
  }
  EXPECT_GE(layouts, 2);
  fs::remove_all(dir);
}

// A job with a checkpoint policy writes one after its last step too: 7 steps, every 3, leave
// step-3, step-6 and step-7, which `latest` names. A 10-step job given the pointer file
// itself resumes at step 7 and ends bitwise as the 10-step job that never stopped and within
// 1e-10 of TrainReference (2BW: no switch anywhere; the final checkpoint holds W(6) for
// mini-batch 7). Negative control: one update short (resumed at step 6, 9 steps) misses.
// A job stopped early (a stop before step 5) writes none beyond its policy's.
TEST_P(ResumeElsewhereTest, AFinishedJobsFinalCheckpointIsWhereALongerJobContinues) {
  const fs::path dir = TempDir("final");
  JobSpec first = Gpt(GetParam(), dir.string());
  first.set_steps(7);
  first.mutable_checkpoint()->set_every(3);
  const JobReport done = MustRun(first);
  ASSERT_EQ(done.losses.size(), 7u);
  for (int64_t n : {3, 6, 7}) EXPECT_TRUE(fs::exists(dir / checkpoint::StepDirName(n))) << n;
  std::ifstream latest(dir / "latest");
  std::string named;
  latest >> named;
  EXPECT_EQ(named, checkpoint::StepDirName(7));
  auto found = checkpoint::FindCheckpoint((dir / "latest").string());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step, 7);
  // Its weights are the finished job's.
  JobSpec longer = first;
  longer.set_steps(10);
  longer.mutable_checkpoint()->set_every(0);
  longer.set_resume_from((dir / "latest").string());
  const JobReport finished = MustRun(longer);
  EXPECT_EQ(finished.first_step, 7);
  ASSERT_EQ(finished.losses.size(), 3u);
  JobSpec whole = longer;
  whole.clear_resume_from();
  whole.clear_checkpoint();
  ExpectBitwiseEqual(finished.final_parameters, MustRun(whole).final_parameters);
  absl::StatusOr<std::vector<at::Tensor>> reference = TrainReference(whole);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_LE(MaxRelativeDifference(finished.final_parameters, *reference), 1e-10);
  // A job asked for no more steps than the checkpoint holds is refused, naming both.
  JobSpec same = longer;
  same.set_steps(7);
  absl::StatusOr<JobReport> nothing = RunInProcess(same);
  EXPECT_THAT(nothing.status().message(), HasSubstr("nothing is left to run"));
  // Negative control: from the checkpoint before step 6 (one update and a resume short).
  JobSpec short_by_one = longer;
  short_by_one.set_resume_from((dir / checkpoint::StepDirName(6)).string());
  short_by_one.set_steps(9);
  const JobReport missed = MustRun(short_by_one);
  EXPECT_GT(MaxRelativeDifference(missed.final_parameters, *reference), 1e-6);
  // A job stopped early by a stop command writes no final checkpoint: `latest` stays on the
  // policy's last one.
  const fs::path stopped_dir = TempDir("stopped");
  JobSpec stopped = first;
  stopped.mutable_checkpoint()->set_dir(stopped_dir.string());
  RunOptions options;
  options.commands = std::make_shared<control::StepCommandQueue>(stopped.steps());
  ASSERT_TRUE(options.commands->Schedule(control::kStop, 5).ok());
  EXPECT_EQ(MustRun(stopped, options).losses.size(), 5u);
  EXPECT_TRUE(fs::exists(stopped_dir / checkpoint::StepDirName(3)));
  EXPECT_FALSE(fs::exists(stopped_dir / checkpoint::StepDirName(5)));
  EXPECT_FALSE(fs::exists(stopped_dir / checkpoint::StepDirName(7)));
  auto kept = checkpoint::FindCheckpoint(stopped_dir.string());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->manifest.step, 3);
  fs::remove_all(stopped_dir);
  fs::remove_all(dir);
}

// Checkpoints are invisible to the math: with a checkpoint every 3 steps (3, 6 and the final
// 8) a job's parameters and losses are bitwise those of the job without, under every schedule
// but those that stash weights (pipedream: its drain starts every stage on its newest version;
// docs/checkpoints.md). A double-buffered (2BW) checkpoint carries W(N-1), which mini-batch N runs
// on: resumed from step 3 on the same layout it ends bitwise as the job that never stopped, and on
// 2 stages x 2 replicas within 1e-10. Negative control: the switch a 2BW checkpoint once was
// (mini-batch 3 on W(3)) moves the reference by far more.
TEST(Checkpoints, LeaveEverySchedulesMathUnchanged) {
  for (const ScheduleCase& k : EveryScheduleKind(4)) {
    if (schedule::WeightsOf(k.kind) == schedule::WeightPolicy::kStashed) continue;
    const std::string name(schedule::ScheduleKindName(k.kind));
    SCOPED_TRACE(name);
    const fs::path dir = TempDir("math_" + name);
    JobSpec plain = Gpt(k, dir.string());
    plain.set_steps(8);
    plain.mutable_checkpoint()->set_every(0);
    const JobReport without = MustRun(plain);
    JobSpec every3 = plain;
    every3.mutable_checkpoint()->set_every(3);
    const JobReport with = MustRun(every3);
    ExpectBitwiseEqual(with.final_parameters, without.final_parameters);
    EXPECT_EQ(with.losses, without.losses);
    for (int64_t n : {3, 6, 8}) EXPECT_TRUE(fs::exists(dir / checkpoint::StepDirName(n))) << n;
    if (schedule::WeightsOf(k.kind) == schedule::WeightPolicy::kDoubleBuffered) {
      JobSpec resumed = every3;
      resumed.mutable_checkpoint()->set_every(0);
      resumed.set_resume_from((dir / checkpoint::StepDirName(3)).string());
      ExpectBitwiseEqual(MustRun(resumed).final_parameters, without.final_parameters);
      JobSpec other = resumed;
      other.set_stages(2);
      other.set_replicas(2);
      other.set_microbatches(2);
      const JobReport moved = MustRun(other);
      EXPECT_EQ(moved.first_step, 3);
      EXPECT_LE(MaxRelativeDifference(moved.final_parameters, without.final_parameters), 1e-10);
      absl::StatusOr<std::vector<at::Tensor>> switched = TrainReference(plain, {3});
      ASSERT_TRUE(switched.ok()) << switched.status();
      EXPECT_GT(MaxRelativeDifference(moved.final_parameters, *switched), 1e-6);
    }
    fs::remove_all(dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, ResumeTest, ::testing::ValuesIn(EveryScheduleKind(4)),
                         pipeline_test::CaseName);
INSTANTIATE_TEST_SUITE_P(Schedules, ResumeElsewhereTest,
                         ::testing::ValuesIn(KindsThatResumeElsewhere()), pipeline_test::CaseName);

// What the job and the checkpoint disagree on is listed, and nothing runs.
TEST(Resume, AnIncompatibleJobIsRefusedWithEveryReason) {
  const fs::path dir = TempDir("refused");
  JobSpec c = Gpt(dir.string());
  MustRun(c);
  JobSpec other = c;
  other.set_resume_from("latest");
  other.mutable_model()->set_d_model(32);
  other.set_microbatch_size(3);
  other.mutable_optimizer()->set_name("sgd");
  absl::StatusOr<JobReport> refused = RunInProcess(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("model differs"));
  EXPECT_THAT(refused.status().message(), HasSubstr("optimizer.name differs"));
  EXPECT_THAT(refused.status().message(), HasSubstr("the global batch"));
  JobSpec none = c;
  none.mutable_checkpoint()->set_dir((dir / "nothing").string());
  none.set_resume_from("latest");
  EXPECT_EQ(RunInProcess(none).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::job
