// Tied weights (model.tie_embeddings: the GPT's LM head uses the token embedding's weight)
// against an independent reference: the un-pipelined trainer with one parameter, the head's
// copy an alias whose gradient adds to it.
// - float64 parameters equal the reference (<= 1e-10) under GPipe, 1F1B, ZB-H1, 2BW,
//   PipeDream's weight stashing (its reference's one parameter used on each stage's own
//   versions; also with m = 1 < p), interleaved and ZB-V (which puts both layers on rank 0),
//   with 1 and 2 replicas, and the two copies are bitwise equal at the end;
// - negative control: copies whose gradients are not summed (the ties dropped from the
//   executor) diverge at the first step;
// - a checkpoint stores the tied weight once (with the embedding) and loads it onto both
//   copies: a job resumed on another layout ends as the uninterrupted one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/checkpoint/manifest.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

JobConfig TiedGpt(ScheduleKind kind, int stages, int virtual_stages = 0) {
  JobConfig c = TinyGpt(kind, stages, 4);
  c.model.tie_embeddings = true;
  c.virtual_stages = virtual_stages;
  c.steps = 4;
  return c;
}

// The embedding's token table is the first parameter, the head's weight the last.
void ExpectCopiesEqual(const std::vector<at::Tensor>& params) {
  ASSERT_GE(params.size(), 2u);
  EXPECT_TRUE(at::equal(params.front(), params.back()));
}

TEST(TiedEmbeddings, EqualTheOneParameterReferenceUnderEverySchedule) {
  struct Case {
    ScheduleKind kind;
    int stages, virtual_stages;
  };
  for (const Case k : {Case{ScheduleKind::kGPipe, 3, 0}, Case{ScheduleKind::kOneFOneB, 3, 0},
                       Case{ScheduleKind::kZeroBubble, 3, 1}, Case{ScheduleKind::kTwoBW, 3, 0},
                       Case{ScheduleKind::kPipeDream, 3, 0},
                       Case{ScheduleKind::kInterleaved, 2, 2},
                       Case{ScheduleKind::kZeroBubbleV, 2, 2},
                       Case{ScheduleKind::kOneFOneB, 1, 0}}) {
    for (const int replicas : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(std::string(schedule::ScheduleKindName(k.kind)), " p=",
                                k.stages, " replicas ", replicas));
      JobConfig c = TiedGpt(k.kind, k.stages, k.virtual_stages);
      c.replicas = replicas;
      const JobReport report = MustRun(c);
      const std::vector<at::Tensor> reference = MustReference(c);
      ASSERT_EQ(report.final_parameters.size(), reference.size());
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
      ExpectCopiesEqual(report.final_parameters);
      ExpectCopiesEqual(reference);
    }
  }
  // PipeDream with fewer micro-batches than stages (stage 0 seals boundaries ahead).
  JobConfig c = TiedGpt(ScheduleKind::kPipeDream, 3);
  c.micro_batches = 1;
  c.steps = 6;
  const JobReport report = MustRun(c);
  EXPECT_LE(MaxRelativeDifference(report.final_parameters, MustReference(c)), 1e-10);
  ExpectCopiesEqual(report.final_parameters);
}

// The ties dropped from every rank's executor: each copy steps on its own gradient, and
// they part at the first step; the reference is no longer met.
TEST(TiedEmbeddings, CopiesWhoseGradientsAreNotSummedDivergeAtTheFirstStep) {
  JobConfig c = TiedGpt(ScheduleKind::kOneFOneB, 3);
  c.steps = 1;
  StagesRun run;
  RunStages(
      c,
      [](StageParts& parts) {
        ASSERT_EQ(parts.config.tied.size(), 1u);
        parts.config.tied.clear();  // the fault
      },
      run);
  for (const absl::Status& r : run.results) ASSERT_TRUE(r.ok()) << r;
  const std::vector<StageParts>& parts = run.parts;
  const at::Tensor embedding = parts[0].weights[0]->Newest().Parameters().front();
  const at::Tensor head = parts[2].weights[0]->Newest().Parameters().back();
  EXPECT_FALSE(at::equal(embedding, head));
  const std::vector<at::Tensor> reference = MustReference(c);
  EXPECT_GT(MaxRelativeDifference({embedding}, {reference.front()}), 1e-6);
  // With the ties, the same run meets the reference.
  const JobReport tied = MustRun(c);
  EXPECT_LE(MaxRelativeDifference(tied.final_parameters, reference), 1e-10);
  ExpectCopiesEqual(tied.final_parameters);
}

TEST(TiedEmbeddings, ACheckpointStoresTheTiedWeightOnceAndResumesOnAnotherLayout) {
  const std::string dir = ::testing::TempDir() + "/tied_checkpoints";
  std::filesystem::remove_all(dir);
  JobConfig c = TiedGpt(ScheduleKind::kOneFOneB, 3);
  c.checkpoint.dir = dir;
  c.checkpoint.every = 2;
  const JobReport whole = MustRun(c);
  // The head (layer 5) holds no copy of the weight in the checkpoint; the embedding its two.
  const std::filesystem::path step = std::filesystem::path(dir) / "step-00000002";
  const auto layer = [&](int index) {
    std::ifstream in(step / checkpoint::LayerFileName(index), std::ios::binary);
    return checkpoint::ParseLayerState(
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  };
  absl::StatusOr<checkpoint::LayerState> embedding = layer(0);
  absl::StatusOr<checkpoint::LayerState> head = layer(5);
  ASSERT_TRUE(embedding.ok()) << embedding.status();
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(embedding->parameters.size(), 2u);
  EXPECT_EQ(head->parameters.size(), 0u);
  for (const ScheduleKind kind : {ScheduleKind::kZeroBubbleV, ScheduleKind::kGPipe}) {
    SCOPED_TRACE(std::string(schedule::ScheduleKindName(kind)));
    JobConfig r = c;
    r.schedule = kind;
    r.stages = 2;
    r.virtual_stages = kind == ScheduleKind::kZeroBubbleV ? 2 : 0;
    r.checkpoint.every = 0;
    r.resume_from = "latest";
    const JobReport rest = MustRun(r);
    EXPECT_EQ(rest.first_step, 2);
    EXPECT_LE(MaxRelativeDifference(rest.final_parameters, whole.final_parameters), 1e-10);
    ExpectCopiesEqual(rest.final_parameters);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
