// Tied weights (model.tie_embeddings: the GPT's LM head uses the token embedding's weight)
// against an independent reference: the un-pipelined trainer with one parameter, the head's
// copy an alias whose gradient adds to it.
// - float64 parameters equal the reference (<= 1e-10) under GPipe, 1F1B, ZB-H1, 2BW,
//   PipeDream's weight stashing (its reference's one parameter used on each stage's own
//   versions; also with m = 1 < p), interleaved, ZB-V, DualPipeV and one stage,
//   with 1 and 2 replicas, and the two copies are bitwise equal at the end;
// - where one rank holds both layers (ZB-V, DualPipeV, one stage under 1F1B, 2BW and
//   PipeDream) they are one parameter: one storage, one optimizer state, the table's bytes
//   counted once; negative control: a head that stops reading the embedding's storage is
//   never stepped and leaves the reference;
// - negative control: copies whose gradients are not summed (the ties dropped from the
//   executor) diverge at the first step;
// - a checkpoint stores the tied weight once (with the embedding) and loads it onto both
//   copies: a job resumed on another layout ends as the uninterrupted one;
// - a TorchScript model's own tie group (model.tie) on two ranks equals the reference with
//   one parameter, its copies bitwise equal (untied, they part); every violation of a group
//   named in one error.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/layer_state.h"
#include "runtime/checkpoint/manifest.h"
#include "tests/pipeline/pipeline_fixture.h"

namespace pipetrain::job::pipeline_test {
namespace {

JobSpec TiedGpt(ScheduleKind kind, int stages, int virtual_stages = 0) {
  JobSpec c = TinyGpt(kind, stages, 4);
  c.mutable_model()->set_tie_embeddings(true);
  c.set_virtual_stages(virtual_stages);
  c.set_steps(4);
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
                       Case{ScheduleKind::kPipeDream, 3, 0}, Case{ScheduleKind::kInterleaved, 2, 2},
                       Case{ScheduleKind::kZeroBubbleV, 2, 2}, Case{ScheduleKind::kDualPipeV, 2, 2},
                       Case{ScheduleKind::kOneFOneB, 1, 0}, Case{ScheduleKind::kTwoBW, 1, 0},
                       Case{ScheduleKind::kPipeDream, 1, 0}}) {
    for (const int replicas : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(std::string(schedule::ScheduleKindName(k.kind)), " p=", k.stages,
                                " replicas ", replicas));
      JobSpec c = TiedGpt(k.kind, k.stages, k.virtual_stages);
      c.set_replicas(replicas);
      const JobReport report = MustRun(c);
      const std::vector<at::Tensor> reference = MustReference(c);
      ASSERT_EQ(report.final_parameters.size(), reference.size());
      EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-10);
      ExpectCopiesEqual(report.final_parameters);
      ExpectCopiesEqual(reference);
    }
  }
  // PipeDream with fewer micro-batches than stages (stage 0 seals boundaries ahead).
  JobSpec c = TiedGpt(ScheduleKind::kPipeDream, 3);
  c.set_microbatches(1);
  c.set_steps(6);
  const JobReport report = MustRun(c);
  EXPECT_LE(MaxRelativeDifference(report.final_parameters, MustReference(c)), 1e-10);
  ExpectCopiesEqual(report.final_parameters);
}

// The ties dropped from every rank's executor: each copy steps on its own gradient, and
// they part at the first step; the reference is no longer met.
TEST(TiedEmbeddings, CopiesWhoseGradientsAreNotSummedDivergeAtTheFirstStep) {
  JobSpec c = TiedGpt(ScheduleKind::kOneFOneB, 3);
  c.set_steps(1);
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

// Where one rank holds both tied layers (ZB-V and DualPipeV put stages 0 and 2p - 1 on rank
// 0; one stage holds all), the head's weight reads the embedding's storage: one tensor, one
// optimizer state, counted once in the rank's parameters (their runs meet the reference in
// EqualTheOneParameterReferenceUnderEverySchedule).
TEST(TiedEmbeddings, OnOneRankTheTiedLayersAreOneParameter) {
  struct Case {
    ScheduleKind kind;
    int stages, virtual_stages;
  };
  for (const Case k : {Case{ScheduleKind::kZeroBubbleV, 2, 2}, Case{ScheduleKind::kDualPipeV, 2, 2},
                       Case{ScheduleKind::kOneFOneB, 1, 0}, Case{ScheduleKind::kTwoBW, 1, 0},
                       Case{ScheduleKind::kPipeDream, 1, 0}}) {
    SCOPED_TRACE(absl::StrCat(std::string(schedule::ScheduleKindName(k.kind)), " p=", k.stages));
    JobSpec c = TiedGpt(k.kind, k.stages, k.virtual_stages);
    StagesRun run;
    RunStages(
        c, [](StageParts&) {}, run);
    for (const absl::Status& r : run.results) ASSERT_TRUE(r.ok()) << r;
    const StageParts& rank0 = run.parts[0];
    const model::StageModule& embedding = rank0.weights.front()->Newest();
    const model::StageModule& head = rank0.weights.back()->Newest();
    const at::Tensor token = embedding.Parameters().front();
    const at::Tensor head_weight = head.Parameters().back();
    EXPECT_EQ(token.data_ptr(), head_weight.data_ptr());
    ASSERT_EQ(head.OwnParameters().size() + 1, head.Parameters().size());
    EXPECT_TRUE(head.OwnParameters().back().is_same(head.Parameters().end()[-2]));
    EXPECT_EQ(rank0.weights.back()->OptimizerState().size(), head.OwnParameters().size());
    // The same layout untied holds the table twice.
    JobSpec untied = c;
    untied.mutable_model()->set_tie_embeddings(false);
    absl::StatusOr<JobPlan> plan = MakeJobPlan(untied);
    ASSERT_TRUE(plan.ok()) << plan.status();
    MicroBatchReader reader(*plan, untied.microbatches());
    absl::StatusOr<StageParts> apart = BuildStage(untied, *plan, reader, 0);
    ASSERT_TRUE(apart.ok()) << apart.status();
    EXPECT_EQ(apart->parameter_bytes - rank0.parameter_bytes,
              token.numel() * static_cast<int64_t>(token.element_size()));
  }
}

// Negative control: the head's weight given a storage of its own again (the fault), the
// rank still takes it for shared, so nobody steps it; the run leaves the reference at the
// first step.
TEST(TiedEmbeddings, AMemberThatNoLongerReadsItsOwnersStorageLeavesTheReference) {
  JobSpec c = TiedGpt(ScheduleKind::kZeroBubbleV, 2, 2);
  c.set_steps(1);
  StagesRun run;
  RunStages(
      c,
      [](StageParts& parts) {
        if (parts.config.stage != 0) return;
        absl::StatusOr<model::StageModule*> head = parts.weights.back()->ModuleFor(0);
        ASSERT_TRUE(head.ok()) << head.status();
        at::Tensor weight = (*head)->Parameters().back();
        weight.set_data(weight.detach().clone());  // the fault
      },
      run);
  for (const absl::Status& r : run.results) ASSERT_TRUE(r.ok()) << r;
  const at::Tensor embedding = run.parts[0].weights.front()->Newest().Parameters().front();
  const at::Tensor head = run.parts[0].weights.back()->Newest().Parameters().back();
  EXPECT_FALSE(at::equal(embedding, head));
  const std::vector<at::Tensor> reference = MustReference(c);
  EXPECT_LE(MaxRelativeDifference({embedding}, {reference.front()}), 1e-10);
  EXPECT_GT(MaxRelativeDifference({head}, {reference.back()}), 1e-6);
}

TEST(TiedEmbeddings, ACheckpointStoresTheTiedWeightOnceAndResumesOnAnotherLayout) {
  const std::string dir = ::testing::TempDir() + "/tied_checkpoints";
  std::filesystem::remove_all(dir);
  JobSpec c = TiedGpt(ScheduleKind::kOneFOneB, 3);
  c.mutable_checkpoint()->set_dir(dir);
  c.mutable_checkpoint()->set_every(2);
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
  // Every kind that updates as the writer did (its weight policy): the rest of the run is
  // the uninterrupted one's.
  for (const ScheduleCase& k : EveryScheduleKind(2)) {
    if (schedule::WeightsOf(k.kind) != schedule::WeightsOf(ScheduleOf(c))) continue;
    SCOPED_TRACE(std::string(schedule::ScheduleKindName(k.kind)));
    JobSpec r = c;
    SetSchedule(r, k.kind);
    r.set_stages(k.stages);
    r.set_virtual_stages(k.virtual_stages);
    r.mutable_checkpoint()->set_every(0);
    r.set_resume_from(step.string());  // latest: the final one
    const JobReport rest = MustRun(r);
    EXPECT_EQ(rest.first_step, 2);
    EXPECT_LE(MaxRelativeDifference(rest.final_parameters, whole.final_parameters), 1e-10);
    ExpectCopiesEqual(rest.final_parameters);
  }
  std::filesystem::remove_all(dir);
}

// An nn.Sequential of four linear layers (32 -> 24 -> 24 -> 24 -> 10) whose middle two start
// with the same weight, as a model saved with them tied has them; the biases are zeros but
// layer 1's (0.1).
std::string SaveScriptedWithEqualWeights(const std::string& path) {
  torch::manual_seed(9);
  torch::jit::Module root("Sequential");
  root.register_attribute("training", c10::BoolType::get(), true);
  const at::Tensor shared = torch::randn({24, 24}) / std::sqrt(24.0);
  auto linear = [&](const char* type, int64_t in, int64_t out, bool relu, bool tied) {
    torch::jit::Module m(type);
    m.register_attribute("training", c10::BoolType::get(), true);
    m.register_parameter(
        "weight", tied ? shared.clone() : torch::randn({out, in}) / std::sqrt(double(in)), false);
    m.register_parameter("bias", torch::full({out}, std::string(type) == "L1" ? 0.1 : 0.0), false);
    m.define(std::string("def forward(self, x):\n  y = torch.matmul(x, self.weight.t()) + "
                         "self.bias\n  return ") +
             (relu ? "torch.relu(y)\n" : "y\n"));
    return m;
  };
  root.register_module("0", linear("L0", 32, 24, true, false));
  root.register_module("1", linear("L1", 24, 24, true, true));
  root.register_module("2", linear("L2", 24, 24, true, true));
  root.register_module("3", linear("L3", 24, 10, false, false));
  root.save(path);
  return path;
}

// The two copies on ranks 0 and 1.
JobSpec ScriptTieJob(const std::string& path) {
  JobSpec c = ScriptJob(path);
  c.mutable_model()->clear_tie();
  for (const char* t : {"1.weight=2.weight"}) c.mutable_model()->add_tie(t);
  return c;
}

TEST(TiedTorchScript, AGroupTheModelNamesIsOneParameterAcrossRanks) {
  const std::string path = SaveScriptedWithEqualWeights(::testing::TempDir() + "/tied.pt");
  const JobSpec c = ScriptTieJob(path);
  const JobReport report = MustRun(c);
  const std::vector<at::Tensor> reference = MustReference(c);
  ASSERT_EQ(report.final_parameters.size(), 8u);  // weight and bias of each layer
  EXPECT_LE(MaxRelativeDifference(report.final_parameters, reference), 1e-5);
  EXPECT_TRUE(at::equal(report.final_parameters[2], report.final_parameters[4]));
  EXPECT_TRUE(at::equal(reference[2], reference[4]));
  // Negative control: untied, the two weights take their own steps and part.
  JobSpec untied = c;
  untied.mutable_model()->clear_tie();
  const JobReport apart = MustRun(untied);
  EXPECT_FALSE(at::allclose(apart.final_parameters[2], apart.final_parameters[4]));
  EXPECT_GT(MaxRelativeDifference(apart.final_parameters, reference), 1e-4);
}

TEST(TiedTorchScript, EveryViolationOfTheGroupsIsNamedInOneError) {
  const std::string path = SaveScriptedWithEqualWeights(::testing::TempDir() + "/tied_bad.pt");
  JobSpec c = ScriptTieJob(path);
  c.mutable_model()->clear_tie();
  for (const char* t : {"1.weight", "9.weight=2.weight", "1.nope=3.bias", "0.weight=3.weight",
                        "0.bias=2.bias=2.bias"})
    c.mutable_model()->add_tie(t);
  absl::StatusOr<JobReport> run = RunInProcess(c, {});
  ASSERT_FALSE(run.ok());
  const std::string message(run.status().message());
  for (const char* expected :
       {"'1.weight': a group ties two or more",
        "no layer '9' for 9.weight (the layers: 0, 1, 2, 3)",
        "layer 1 has no parameter 'nope' (its parameters: weight, bias)",
        "'0.weight=3.weight': the parameters' shapes differ", "2.bias is tied twice"}) {
    EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n" << message;
  }
  c.mutable_model()->clear_tie();
  for (const char* t : {"1.bias=0.bias"}) c.mutable_model()->add_tie(t);
  absl::StatusOr<JobReport> apart = RunInProcess(c, {});
  ASSERT_FALSE(apart.ok());
  EXPECT_NE(std::string(apart.status().message())
                .find("'1.bias=0.bias': the parameters start with different values"),
            std::string::npos)
      << apart.status();
  // Two zero biases of one shape start equal and may be tied.
  c.mutable_model()->clear_tie();
  for (const char* t : {"0.bias=2.bias"}) c.mutable_model()->add_tie(t);
  EXPECT_TRUE(RunInProcess(c, {}).ok());
  // A built-in model names no groups.
  JobSpec gpt = TinyGpt(ScheduleKind::kOneFOneB, 2, 2);
  gpt.mutable_model()->clear_tie();
  for (const char* t : {"0.token=3.weight"}) gpt.mutable_model()->add_tie(t);
  absl::StatusOr<JobReport> builtin = RunInProcess(gpt, {});
  ASSERT_FALSE(builtin.ok());
  EXPECT_NE(std::string(builtin.status().message())
                .find("only a torchscript model names tie "
                      "groups"),
            std::string::npos);
}

}  // namespace
}  // namespace pipetrain::job::pipeline_test
