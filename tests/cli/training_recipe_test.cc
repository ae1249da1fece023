// The training recipe (clipping, a learning-rate schedule, weight-decay groups, evaluation) as
// users run it: one job on 4 stages x 2 replicas in every launch mode, under every schedule.
#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/schedule/schedule.h"
#include "tests/cli/cli_fixture.h"
#include "tests/pipeline/schedule_cases.h"

using namespace pipetrain::cli_test;  // NOLINT: the fixture's helpers
namespace pipeline_test = pipetrain::job::pipeline_test;

namespace {

// The training recipe on 4 stages x 2 replicas (clipping by the whole model's norm, a
// warm-up and cosine decay, no weight decay on biases and norms, evaluation on held-out
// data) as threads, with each rank a process of its own (Gloo between them: the norm's parts
// and the evaluated activations cross processes) and with each a worker daemon: as threads and
// as processes within 1e-10 of the reference (torch's clip_grad_norm_ over the whole model,
// LambdaLR, two parameter groups), their norms and evaluations within 1e-10 of each other; on
// the daemons bitwise the processes' weights, norms and evaluations (the same arithmetic over
// Gloo). For every kind of schedule (the one list; chunked kinds on 2 ranks of their default
// chunks), one test each.
class TrainingRecipeTest : public CliTest,
                           public ::testing::WithParamInterface<pipeline_test::ScheduleCase> {};

TEST_P(TrainingRecipeTest, IsExactAsThreadsProcessesAndOnTheDaemons) {
  const pipeline_test::ScheduleCase& k = GetParam();
  const std::string schedule(pipetrain::schedule::ScheduleKindName(k.kind));
  const std::string layout = LayoutFlags(k.stages, k.virtual_stages);
  const std::string job =
      " --dtype float64" + layout +
      " --replicas 2 --microbatches 4 --steps 4 --d-model 16"
      " --n-heads 2 --n-layers 2 --seq-len 8 --vocab 16 --optimizer adamw --lr 0.01"
      " --clip-grad-norm 0.2 --warmup-steps 1 --lr-decay cosine --weight-decay 0.1"
      " --no-decay bias,norm --eval-every 2 --eval-batches 2 --eval-split 0.25";
  const auto near = [](const nlohmann::json& a, const nlohmann::json& b) {
    return std::abs(a.get<double>() - b.get<double>()) <= 1e-10 * std::abs(b.get<double>());
  };
  std::map<std::string, nlohmann::json> summaries;
  std::map<std::string, std::string> weights;
  for (const std::string launch : {"threads", "processes", "cluster"}) {
    const fs::path summary = dir_ / (launch + ".json"), saved = dir_ / (launch + ".pt");
    Result r = Run("run -q --launch " + launch + (launch == "cluster" ? "" : " --reference") +
                   " --schedule " + schedule + job + " --summary " + summary.string() +
                   " --save-weights " + saved.string());
    ASSERT_EQ(r.exit_code, 0) << launch << ": " << r.err;
    summaries[launch] = nlohmann::json::parse(ReadFile(summary));
    weights[launch] = ReadFile(saved);
    ASSERT_FALSE(weights[launch].empty());
  }
  const nlohmann::json &threads = summaries["threads"], &processes = summaries["processes"];
  EXPECT_LE(threads["max_param_rel_diff"].get<double>(), 1e-10);
  EXPECT_LE(processes["max_param_rel_diff"].get<double>(), 1e-10);
  ASSERT_EQ(processes["grad_norms"].size(), 4u);
  ASSERT_EQ(threads["grad_norms"].size(), 4u);
  bool clipped = false;
  for (size_t t = 0; t < 4; ++t) {
    clipped |= processes["grad_norms"][t].get<double>() > 0.2;
    EXPECT_TRUE(near(processes["grad_norms"][t], threads["grad_norms"][t])) << t;
  }
  EXPECT_TRUE(clipped) << processes["grad_norms"];
  ASSERT_EQ(processes["evals"].size(), 2u);  // before steps 2 and 4
  ASSERT_EQ(threads["evals"].size(), 2u);
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(processes["evals"][e]["step"], 2 * (e + 1));
    EXPECT_TRUE(near(processes["evals"][e]["loss"], threads["evals"][e]["loss"])) << e;
  }
  EXPECT_EQ(summaries["cluster"]["grad_norms"], processes["grad_norms"]);
  EXPECT_EQ(summaries["cluster"]["evals"], processes["evals"]);
  EXPECT_EQ(summaries["cluster"]["losses"], processes["losses"]);
  EXPECT_TRUE(weights["cluster"] == weights["processes"]) << "the daemons' weights differ";
}

INSTANTIATE_TEST_SUITE_P(Schedules, TrainingRecipeTest,
                         ::testing::ValuesIn(pipeline_test::EveryScheduleKind(4)),
                         pipeline_test::CaseName);

}  // namespace
