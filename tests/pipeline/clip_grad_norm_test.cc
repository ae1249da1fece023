// Global gradient clipping (optimizer.clip_grad_norm, docs/design.md section 4.7b), stages as
// threads, float64:
// - the final parameters equal the reference's (<= 1e-10: torch::nn::utils::clip_grad_norm_
//   over the whole model's trained parameters, a tie once, before torch.optim's step) and the
//   reported norm of every step is the reference's, under every schedule kind (2BW: the norm
//   of the gradient its update applies, mini-batch t's, taken on W(t-1)), 4 stages x 2
//   replicas, 2 ranks of chunks for the kinds with chunks, with a threshold
//   that some steps' norms pass and others do not, SGD and AdamW, tied embeddings across
//   ranks and on one rank;
// - negative controls: clipping each stage by its own norm (a pipeline without the reduction
//   across stages) and not clipping both miss the run;
// - a threshold above every norm changes nothing, under every kind: bitwise the run without
//   clipping, which reports no norm;
// - every rank of every replica computes the same norm, bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

using Case = ScheduleCase;

std::string Name(const Case& k) {
  return absl::StrCat(std::string(schedule::ScheduleKindName(k.kind)), " p=", k.stages,
                      k.virtual_stages > 1 ? absl::StrCat(" v=", k.virtual_stages) : "");
}

JobSpec Clipped(const Case& k, const char* optimizer) {
  JobSpec c = TinyGpt(k, 4);
  c.set_replicas(2);
  c.set_steps(6);
  c.mutable_optimizer()->set_name(optimizer);
  c.mutable_optimizer()->set_lr(std::string(optimizer) == "sgd" ? 0.2 : 0.02);
  return c;
}

// The reference's norms without clipping decide a threshold that some steps pass and some
// do not (their median), so that both branches of min(1, C / norm) run.
double ThresholdBetweenTheNorms(JobSpec c) {
  c.mutable_optimizer()->set_clip_grad_norm(1e9);
  std::vector<double> norms;
  auto ref = TrainReference(c, {}, ReferenceClipping::kWholeModel, &norms);
  EXPECT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(norms.size(), static_cast<size_t>(c.steps()));
  if (norms.empty()) return 1.0;
  std::sort(norms.begin(), norms.end());
  return norms[norms.size() / 2];
}

TEST(GradientClipping, EqualsClipGradNormOverTheWholeModel) {
  const std::vector<Case> kinds = EveryScheduleKind(4);
  for (size_t i = 0; i < kinds.size(); ++i) {
    const Case& k = kinds[i];
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (const bool tied : {false, true}) {
        // Two of the four a kind: each kind meets both optimizers and both, the next kind
        // the other two (so that the sweep's cost stays that of a few kinds).
        if ((i + (std::string(optimizer) == "adamw") + tied) % 2 != 0) continue;
        SCOPED_TRACE(absl::StrCat(Name(k), " ", optimizer, tied ? " tied" : ""));
        JobSpec c = Clipped(k, optimizer);
        c.mutable_model()->set_tie_embeddings(tied);
        c.mutable_optimizer()->set_clip_grad_norm(ThresholdBetweenTheNorms(c));
        const JobReport report = MustRun(c);
        std::vector<double> norms;
        auto reference = TrainReference(c, {}, ReferenceClipping::kWholeModel, &norms);
        ASSERT_TRUE(reference.ok()) << reference.status();
        ASSERT_EQ(report.final_parameters.size(), reference->size());
        EXPECT_LE(MaxRelativeDifference(report.final_parameters, *reference), 1e-10);
        // Every step's norm is the reference's; some were clipped, some not.
        ASSERT_EQ(report.grad_norms.size(), norms.size());
        int clipped = 0;
        for (size_t t = 0; t < norms.size(); ++t) {
          EXPECT_NEAR(report.grad_norms[t], norms[t], 1e-10 * norms[t]) << "step " << t;
          clipped += norms[t] > c.optimizer().clip_grad_norm();
        }
        EXPECT_GT(clipped, 0);
        EXPECT_LT(clipped, c.steps());
        // Negative controls: each stage clipped by its own norm, and no clipping, miss it.
        auto alone = TrainReference(c, {}, ReferenceClipping::kEachStageAlone);
        ASSERT_TRUE(alone.ok()) << alone.status();
        EXPECT_GT(MaxRelativeDifference(report.final_parameters, *alone), 1e-6);
        JobSpec unclipped = c;
        unclipped.mutable_optimizer()->set_clip_grad_norm(0);
        EXPECT_GT(MaxRelativeDifference(report.final_parameters, MustReference(unclipped)), 1e-6);
      }
    }
  }
}

// The norm every rank of every replica computed is one number, to the bit: it is what each
// scaled its gradient by (replicas hold the same gradient after their AllReduce; a pipeline's
// ranks sum the same parts in the same order).
TEST(GradientClipping, EveryRankOfEveryReplicaHasTheSameNorm) {
  JobSpec c = Clipped({ScheduleKind::kOneFOneB, 4, 0}, "adamw");
  c.mutable_optimizer()->set_clip_grad_norm(0.1);
  const JobReport report = MustRun(c);
  ASSERT_EQ(report.stage_stats.size(), 8u);
  for (const executor::StageStats& stats : report.stage_stats) {
    ASSERT_EQ(stats.steps.size(), report.stage_stats[0].steps.size());
    for (size_t t = 0; t < stats.steps.size(); ++t) {
      ASSERT_TRUE(stats.steps[t].grad_norm.has_value());
      EXPECT_EQ(*stats.steps[t].grad_norm, *report.stage_stats[0].steps[t].grad_norm);
    }
  }
}

// A threshold no norm reaches scales by 1: bitwise the job without clipping (which reports
// no norm), for the delayed update of 2BW too.
TEST(GradientClipping, AThresholdAboveEveryNormChangesNothing) {
  for (const Case& k : EveryScheduleKind(4)) {
    SCOPED_TRACE(Name(k));
    JobSpec c = Clipped(k, "adamw");
    const JobReport plain = MustRun(c);
    EXPECT_TRUE(plain.grad_norms.empty());
    c.mutable_optimizer()->set_clip_grad_norm(1e6);
    const JobReport clipped = MustRun(c);
    EXPECT_TRUE(BitwiseEqual(clipped.final_parameters, plain.final_parameters));
    EXPECT_EQ(clipped.grad_norms.size(), static_cast<size_t>(c.steps()));
  }
}

TEST(GradientClipping, AnInvalidThresholdIsRefused) {
  JobSpec c = Clipped({ScheduleKind::kOneFOneB, 2, 0}, "sgd");
  c.mutable_optimizer()->set_clip_grad_norm(-1);
  absl::StatusOr<JobReport> run = RunInProcess(c, {});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find(
                "optimizer.clip_grad_norm: must be in [0, 1,000,000,000,000] (a finite norm; 0: no "
                "clipping), got -1"),
            std::string::npos)
      << run.status();
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
