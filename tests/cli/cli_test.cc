// The pipetrain CLI as users run it: the default job, planning, the report in every launch
// mode, and bad input (the stage processes: stage_processes_test.cc).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jobspec/spec_yaml.h"
#include "runtime/job/job_spec.h"
#include "runtime/schedule/schedule.h"
#include "tests/cli/cli_fixture.h"
#include "tests/jobspec/one_job.h"
#include "tests/pipeline/schedule_cases.h"

namespace {

using namespace pipetrain::cli_test;  // NOLINT: the fixture's helpers
namespace pipeline_test = pipetrain::job::pipeline_test;
namespace schedule = pipetrain::schedule;

// The README's main command: the built-in GPT, built-in corpus, 4 stages, 2BW.
TEST_F(CliTest, DefaultRunIsFastAndLearnsTheCorpus) {
  const fs::path summary = dir_ / "summary.json";
  Result r = Run("run --summary " + summary.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(r.seconds, 180.0);
  auto j = nlohmann::json::parse(ReadFile(summary));
  EXPECT_EQ(j["schedule"], "2bw");
  EXPECT_EQ(j["stages"], 4);
  const auto losses = j["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), j["steps"].get<size_t>());
  const double first = losses.front(), last = j["final_loss"].get<double>();
  const double entropy = j["data_entropy"].get<double>();
  EXPECT_EQ(last, losses.back());
  EXPECT_GT(entropy, 0.5);
  EXPECT_GE((first - last) / (first - entropy), 0.90)
      << "first " << first << " final " << last << " entropy " << entropy;
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
  EXPECT_GT(j["ideal_step_time_s"].get<double>(), 0);
  ASSERT_EQ(j["per_stage"].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    const auto& st = j["per_stage"][s];
    EXPECT_EQ(st["peak_stashed_microbatches"], 4 - s);  // 2BW: p - s
    EXPECT_EQ(st["peak_weight_versions"], 2);
    EXPECT_GT(st["compute_s"].get<double>(), 0);
    EXPECT_GE(st["wait_s"].get<double>(), 0);
  }
  EXPECT_THAT(r.out, HasSubstr("of the gap closed"));
}

// `pipetrain plan`: the layout, its predictions and the alternatives as JSON; a memory cap
// that forbids every layout is a clear error; `stages: auto` runs the layout plan printed.
TEST_F(CliTest, PlanPrintsALayoutThatStagesAutoRuns) {
  setenv("PIPETRAIN_CACHE_DIR", (dir_ / "profiles").c_str(), 1);
  const std::string job = " --planner hippie --steps 3 --microbatch-sizes 4,8,16";
  Result r = Run("plan --workers 4 -o json -q" + job);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto plan = nlohmann::json::parse(r.out);
  EXPECT_EQ(plan["planner"], "hippie");
  EXPECT_EQ(plan["schedule"], "1f1b");  // Hippie's last-stage schedule
  const int p = static_cast<int>(plan["stages"].size());
  ASSERT_GE(p, 1);
  EXPECT_LE(p * plan["replicas"].get<int>(), 4);
  // The default job's global batch: 1 replica x 8 micro-batches x 8.
  EXPECT_EQ(plan["replicas"].get<int>() * plan["microbatches"].get<int>() *
                plan["microbatch_size"].get<int>(),
            64);
  EXPECT_EQ(plan["stages"][0][0], 0);
  EXPECT_EQ(plan["stages"][p - 1][1], 7);  // the default GPT's 7 layers
  EXPECT_EQ(plan["predicted_peak_memory_bytes"].size(), static_cast<size_t>(p));
  EXPECT_GT(plan["predicted_step_time_s"].get<double>(), 0);
  EXPECT_TRUE(plan["recompute"].is_array());
  EXPECT_FALSE(plan["alternatives"].empty());
  for (const auto& a : plan["alternatives"]) EXPECT_TRUE(a.contains("why"));
  // Every schedule on the chosen shape: one marked best (a flushing one, as Hippie's), each
  // other with why it lost.
  ASSERT_EQ(plan["schedules"].size(), 8u);
  int best = 0;
  for (const auto& s : plan["schedules"]) {
    SCOPED_TRACE(s.dump());
    if (s["best"].get<bool>()) {
      ++best;
      EXPECT_EQ(s["why"], "");
      EXPECT_NE(s["schedule"], "2bw");
      EXPECT_NE(s["schedule"], "pipedream");
    } else {
      EXPECT_NE(s["why"], "");
    }
  }
  EXPECT_EQ(best, 1);

  // A job file with its own layer ranges is planned anew (its ranges give way to the plan),
  // and profiled, rather than refused as `stages: auto` beside explicit ranges.
  const fs::path ranged = Write("ranged.yaml", "stages: [[0, 3], [3, 7]]\n");
  Result replanned = Run("plan " + ranged.string() + " --workers 4 -o json -q" + job);
  ASSERT_EQ(replanned.exit_code, 0) << replanned.err;
  EXPECT_EQ(nlohmann::json::parse(replanned.out)["stages"], plan["stages"]);
  Result profiled = Run("profile " + ranged.string() + " -q" + job);
  ASSERT_EQ(profiled.exit_code, 0) << profiled.err;
  EXPECT_TRUE(nlohmann::json::parse(profiled.out).contains("sizes"));
  Result kept = Run("plan " + ranged.string() + " --predict -o json -q" + job);
  ASSERT_EQ(kept.exit_code, 0) << kept.err;
  EXPECT_EQ(nlohmann::json::parse(kept.out)["stages"], nlohmann::json::parse("[[0, 3], [3, 7]]"));

  Result tiny = Run("plan --workers 4 --memory-per-worker 64KiB -q" + job);
  EXPECT_EQ(tiny.exit_code, 1);
  EXPECT_THAT(tiny.err, HasSubstr("pipetrain: does not fit: needs "));
  EXPECT_THAT(tiny.err, HasSubstr(" bytes on stage "));
  EXPECT_THAT(tiny.err, HasSubstr(", have 58982 (90% of 65536)"));

  // The same job with `stages: auto`, planned for 4 workers, runs the plan's layout under
  // the schedule it marks.
  const nlohmann::json runs = AutoRuns(plan);
  const fs::path summary = dir_ / "summary.json";
  Result run = Run("run --launch threads --stages auto --plan-workers 4 --summary " +
                   summary.string() + job);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto ran = nlohmann::json::parse(ReadFile(summary));
  EXPECT_EQ(ran["schedule"], runs["schedule"]);
  EXPECT_EQ(ran["partition"], runs["stages"]);
  EXPECT_EQ(ran["replicas"], plan["replicas"]);
  EXPECT_EQ(ran["microbatches"], plan["microbatches"]);
  EXPECT_EQ(ran["microbatch_size"], plan["microbatch_size"]);
  EXPECT_EQ(
      ran["config"]["recompute"], plan["recompute"].empty() ? "none" : "layers:" + [&] {
        std::string s;
        for (const auto& l : plan["recompute"])
          s += (s.empty() ? "" : ",") + std::to_string(l.get<int>());
        return s;
      }());
  EXPECT_THAT(run.err, HasSubstr("hippie planner:"));
  if (runs["schedule"] != plan["schedule"]) {
    EXPECT_THAT(run.err, HasSubstr("runs " + runs["schedule"].get<std::string>() +
                                   ", the schedule marked on this shape"));
  }
  // The summary keeps the plan it ran, as a cluster's does.
  EXPECT_EQ(ran["plan"]["planner"], "hippie");
  EXPECT_EQ(ran["plan"]["workers"], 4);
  EXPECT_EQ(ran["plan"]["predicted_peak_memory_bytes"], runs["predicted_peak_memory_bytes"]);
  EXPECT_DOUBLE_EQ(ran["plan"]["predicted_step_time_s"].get<double>(),
                   runs["predicted_step_time_s"].get<double>());
  unsetenv("PIPETRAIN_CACHE_DIR");
}

// `stages: auto` on daemons: the CLI profiles the model, the coordinator plans the job for
// the workers registered (here 2 on this machine) and the job runs that layout: the one
// `pipetrain plan --workers 2` prints from the same profile.
TEST_F(CliTest, StagesAutoOnDaemonsRunsThePlannedLayout) {
  setenv("PIPETRAIN_CACHE_DIR", (dir_ / "profiles").c_str(), 1);
  const std::string job = " --planner hippie --steps 3";
  Result planned = Run("plan --workers 2 -o json -q" + job);
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  const auto plan = nlohmann::json::parse(planned.out);
  const nlohmann::json runs = AutoRuns(plan);
  const fs::path summary = dir_ / "summary.json";
  Result run =
      Run("run --launch cluster --stages auto --workers 2 --summary " + summary.string() + job);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("planned by hippie: "));
  const auto ran = nlohmann::json::parse(ReadFile(summary));
  EXPECT_EQ(ran["state"], "succeeded");
  EXPECT_EQ(ran["config"]["schedule"], runs["schedule"]);
  EXPECT_EQ(ran["config"]["stage_ranges"], runs["stages"]);
  EXPECT_EQ(ran["config"]["replicas"], plan["replicas"]);
  EXPECT_EQ(ran["config"]["microbatches"], plan["microbatches"]);
  EXPECT_EQ(ran["config"]["microbatch_size"], plan["microbatch_size"]);
  EXPECT_EQ(ran["config"]["auto_stages"], false);
  // The workers' measured peak tensor memory per rank, against the coordinator's plan: within
  // 15% per rank where a rank holds one model stage and keeps its whole stash until its
  // backward. Which layout runs depends on this machine's timings (under load, Hippie picks
  // recomputation, and ZB-H1 with it). Two layouts are known to split their memory between
  // the ranks less exactly than the plan says (docs/design.md section 10): ranks holding
  // several model stages (V-shapes, interleaved) and ZB-H1 with recomputed layers, whose I
  // the plan counts as holding the whole recomputed stash until W (an upper bound: rank 0
  // measured 19% below with layers 1 and 2 recomputed). There each rank is held to 30% and
  // the ranks' sum to 15%.
  const auto& predicted = ran["plan"]["predicted_peak_memory_bytes"];
  EXPECT_EQ(predicted, runs["predicted_peak_memory_bytes"]);
  ASSERT_EQ(predicted.size(), plan["stages"].size());  // per rank
  const bool chunked = runs["stages"].size() > predicted.size();
  const bool split_and_recomputed = runs["schedule"] == "zb1p" && !plan["recompute"].empty();
  const bool looser = chunked || split_and_recomputed;
  double predicted_sum = 0, measured_sum = 0;
  for (const auto& stage : ran["per_stage"]) {
    const double expected = predicted[stage["stage"].get<int>()].get<double>();
    const double measured = stage["peak_tensor_bytes"].get<double>();
    EXPECT_NEAR(measured, expected, (looser ? 0.30 : 0.15) * expected)
        << "rank " << stage["stage"] << " of " << runs.dump();
    predicted_sum += expected;
    measured_sum += measured;
  }
  EXPECT_NEAR(measured_sum, predicted_sum, 0.15 * predicted_sum) << run.err;
  unsetenv("PIPETRAIN_CACHE_DIR");
}

// `pipetrain profile-link`: one side listens, the other connects from its own address, and
// the listening side writes the links as JSON, which `plan --hosts --host-links` reads to
// put ranks on hosts (every layout scored on its faster placement; --predict shows each).
TEST_F(CliTest, ProfileLinkMeasuresALinkAndPlanPlacesRanksOnHosts) {
  setenv("PIPETRAIN_CACHE_DIR", (dir_ / "profiles").c_str(), 1);
  const std::string port = std::to_string(20000 + getpid() % 20000);
  const fs::path links = dir_ / "links.json";
  std::thread leader([&] {
    const std::string command = std::string(PIPETRAIN_CLI) +
                                " profile-link --listen 127.0.0.1 --port " + port + " -o " +
                                links.string() + " 2>" + (dir_ / "leader.err").string();
    EXPECT_EQ(std::system(command.c_str()), 0) << ReadFile(dir_ / "leader.err");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Result follower = Run("profile-link --connect 127.0.0.1:" + port + " --address 127.0.0.1");
  leader.join();
  ASSERT_EQ(follower.exit_code, 0) << follower.err;
  const nlohmann::json measured = nlohmann::json::parse(ReadFile(links), nullptr, false);
  ASSERT_TRUE(measured.is_object()) << ReadFile(links);
  EXPECT_GT(measured["p2p"]["bytes_per_s"].get<double>(), 0);
  EXPECT_GT(measured["allreduce"]["bytes_per_s"].get<double>(), 0);

  const std::string job = " --steps 3 --microbatch-sizes 8 --host-links " + links.string();
  Result plan = Run("plan --hosts 2,2 -o json -q" + job);
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const auto planned = nlohmann::json::parse(plan.out);
  EXPECT_EQ(planned["workers"], 4);
  const int ranks = static_cast<int>(planned["stages"].size()) * planned["replicas"].get<int>();
  if (ranks > 1) {
    ASSERT_EQ(planned["rank_hosts"].size(), static_cast<size_t>(ranks)) << plan.out;
    std::map<int, int> on_host;
    for (const auto& h : planned["rank_hosts"]) ++on_host[h.get<int>()];
    for (const auto& [host, count] : on_host) {
      EXPECT_TRUE(host == 0 || host == 1) << host;
      EXPECT_LE(count, 2) << "host " << host;
    }
  }
  Result predicted = Run("plan --predict --stages 2 --replicas 2 --hosts 2,2 -o json -q" + job);
  ASSERT_EQ(predicted.exit_code, 0) << predicted.err;
  const auto each = nlohmann::json::parse(predicted.out);
  ASSERT_EQ(each["placements"].size(), 2u) << predicted.out;
  // Placements within a relative 1e-9 of each other are a tie, kept in the order tried.
  EXPECT_LE(each["placements"][0]["predicted_step_time_s"].get<double>(),
            each["placements"][1]["predicted_step_time_s"].get<double>() * (1 + 1e-9));
  EXPECT_EQ(each["rank_hosts"], each["placements"][0]["rank_hosts"]);

  Result miscounted = Run("plan --hosts 2,2 --workers 3 -q" + job);
  EXPECT_EQ(miscounted.exit_code, 2);
  EXPECT_THAT(miscounted.err, HasSubstr("--hosts 2,2 has 4 workers; --workers says 3"));
  Result alone = Run("profile-link --connect 127.0.0.1:1");
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_THAT(alone.err, HasSubstr("--connect needs --address"));
}

// Every kind of schedule (the one list) in threads: kinds whose ranks hold one stage on the
// explicit layout 0:2,2:4,4:5; kinds with chunks on their default layout of ranks.
TEST_F(CliTest, ReferenceCheckIsExactInFloat64) {
  for (const pipeline_test::ScheduleCase& k : pipeline_test::EveryScheduleKind(3)) {
    const std::string name(schedule::ScheduleKindName(k.kind));
    SCOPED_TRACE(name);
    std::string layout = " --stages 0:2,2:4,4:5";
    if (schedule::HoldsChunks(k.kind)) {
      layout = LayoutFlags(k.stages, k.virtual_stages);
    }
    const fs::path summary = dir_ / "summary.json";
    Result r = Run("run -q --reference --dtype float64 --schedule " + name + layout +
                   " --microbatches 4 --steps 5 --d-model 16 --n-heads 2"
                   " --n-layers 2 --seq-len 8 --vocab 16 --summary " +
                   summary.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto j = nlohmann::json::parse(ReadFile(summary));
    EXPECT_EQ(j["schedule"], name);
    EXPECT_LE(j["max_param_rel_diff"].get<double>(), 1e-10) << name;
  }
}

// AdamW's betas, eps and weight decay reach the optimizer: they change the result, and the
// result still equals torch.optim.AdamW's with the same values.
TEST_F(CliTest, AdamWFlagsReachTheOptimizer) {
  const std::string job =
      "run -q --reference --dtype float64 --schedule 1f1b --stages 2 --microbatches 2 "
      "--steps 4 --d-model 16 --n-heads 2 --n-layers 2 --seq-len 8 --vocab 16 --lr 0.01 "
      "--summary ";
  const fs::path plain = dir_ / "plain.json", tuned = dir_ / "tuned.json";
  Result a = Run(job + plain.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  Result b = Run(job + tuned.string() + " --beta1 0.5 --beta2 0.9 --eps 1e-3 --weight-decay 0.1");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  auto ja = nlohmann::json::parse(ReadFile(plain)), jb = nlohmann::json::parse(ReadFile(tuned));
  EXPECT_NE(ja["final_loss"].get<double>(), jb["final_loss"].get<double>());
  EXPECT_LE(jb["max_param_rel_diff"].get<double>(), 1e-10);
}

TEST_F(CliTest, YamlJobFileWithFlagOverride) {
  const fs::path job = Write("job.yaml", R"(
model: {name: mlp, hidden: 16, hidden_layers: 3, input_dim: 8, num_classes: 4}
data: {num_samples: 512}
schedule: gpipe
stages: [[0, 2], [2, 4]]
microbatches: 4
microbatch_size: 4
steps: 50
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
dtype: float64
)");
  const fs::path summary = dir_ / "summary.json";
  Result r = Run("run " + job.string() + " --steps 3 -q --reference --summary " + summary.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(ReadFile(summary));
  EXPECT_EQ(j["steps"], 3);  // the flag won
  EXPECT_EQ(j["schedule"], "gpipe");
  EXPECT_EQ(j["partition"], nlohmann::json::parse("[[0, 2], [2, 4]]"));
  EXPECT_LE(j["max_param_rel_diff"].get<double>(), 1e-10);
}

// The keys of a JSON object, sorted.
std::vector<std::string> KeysOf(const nlohmann::json& object) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.push_back(key);
  return keys;
}

// The summaries of one job run in each launch mode (keyed by the mode) follow one schema and
// agree on what every mode measures. The keys a mode leaves null are exactly `nulls`
// (docs/design.md section 8.8).
void ExpectOneSummarySchema(const std::map<std::string, nlohmann::json>& summaries) {
  const std::map<std::string, std::set<std::string>> nulls = {
      {"threads",
       {"job_id", "plan", "max_param_rel_diff", "allreduce_s", "exposed_allreduce_s",
        "stage.worker"}},
      {"processes",
       {"job_id", "plan", "max_param_rel_diff", "allreduce_s", "exposed_allreduce_s",
        "stage.worker"}},
      {"cluster",
       {"model", "data", "ideal_step_time_s", "pipeline_efficiency", "plan", "max_param_rel_diff",
        "allreduce_s", "exposed_allreduce_s", "data_entropy", "threads_per_stage",
        "stage.allreduce_s", "stage.peak_stashed_microbatches", "stage.peak_weight_versions",
        "stage.bytes_sent"}},
  };
  const nlohmann::json& first = summaries.begin()->second;
  for (const auto& [launch, j] : summaries) {
    SCOPED_TRACE("summary of --launch " + launch);
    EXPECT_EQ(j["launch"], launch);
    EXPECT_EQ(KeysOf(j), KeysOf(first));
    std::set<std::string> null_keys;
    for (const auto& [key, value] : j.items()) {
      if (value.is_null()) null_keys.insert(key);
    }
    ASSERT_FALSE(j["per_stage"].empty());
    for (const nlohmann::json& stage : j["per_stage"]) {
      EXPECT_EQ(KeysOf(stage), KeysOf(first["per_stage"][0]));
      for (const auto& [key, value] : stage.items()) {
        if (value.is_null()) null_keys.insert("stage." + key);
      }
    }
    EXPECT_EQ(null_keys, nulls.at(launch));
    for (const char* same :
         {"state", "schedule", "stages", "replicas", "microbatches", "microbatch_size", "steps",
          "partition", "first_step", "losses", "learning_rates", "grad_norms", "evals",
          "first_loss", "final_loss", "skipped_steps"}) {
      EXPECT_EQ(j[same], first[same]) << same;
    }
    // The job evaluates before every step after the first, on held-out data.
    ASSERT_EQ(j["evals"].size(), first["steps"].get<size_t>());
    for (size_t k = 0; k < j["evals"].size(); ++k) {
      EXPECT_EQ(j["evals"][k]["step"], k + 1);
      EXPECT_GT(j["evals"][k]["loss"].get<double>(), 0);
    }
    // The job clips: a norm per step, each positive and finite.
    ASSERT_EQ(j["grad_norms"].size(), first["steps"].get<size_t>());
    for (const auto& norm : j["grad_norms"]) {
      EXPECT_TRUE(std::isfinite(norm.get<double>()) && norm.get<double>() > 0) << norm;
    }
    EXPECT_EQ(j["losses"].size(), first["steps"].get<size_t>());
    // The warm-up's rates: lr (t + 1) / 2.
    EXPECT_EQ(j["learning_rates"], nlohmann::json::array({0.025, 0.05}));
    for (size_t s = 0; s < j["per_stage"].size(); ++s) {
      EXPECT_EQ(j["per_stage"][s]["layers"], first["partition"][s]);
      EXPECT_EQ(j["per_stage"][s]["parameter_bytes"], first["per_stage"][s]["parameter_bytes"]);
      EXPECT_GT(j["per_stage"][s]["compute_s"].get<double>(), 0);
      EXPECT_GT(j["per_stage"][s]["peak_memory_bytes"].get<int64_t>(), 0);
    }
    EXPECT_GT(j["step_time_s"].get<double>(), 0);
    EXPECT_GT(j["samples_per_s"].get<double>(), 0);
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
  }
}

// One job, from a YAML file and from flags, runs as exactly that job in every launch mode:
// the "config" each run reports is the spec's conversion (made here in process), name and
// weights_dir included (on a cluster, with the checkpoint.dir of its own the coordinator
// gives a job without one), and so is what --dry-run prints; every rank writes its weights to
// weights_dir; --save-weights works in each mode, and the trained weights are bitwise the
// same whichever launch ran them. The summaries have one schema (jobspec/run_summary.h): the
// same keys in every mode, at the top and in each stage, and the same layout, partition and
// per-step losses (bitwise: the same arithmetic ran); a figure a mode does not measure is
// null there, and only the ones docs/cli.md lists.
TEST_F(CliTest, OneJobMeansTheSameInEveryLaunchMode) {
  absl::StatusOr<pipetrain::v1::JobSpec> spec =
      pipetrain::jobspec::JobSpecFromYaml(pipetrain::test::kOneJobYaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<pipetrain::job::JobSpec> config = pipetrain::job::Validated(*spec);
  ASSERT_TRUE(config.ok()) << config.status();
  nlohmann::json expected = nlohmann::json::parse(pipetrain::job::JobToJson(*config));
  const fs::path job_file = Write("one.yaml", pipetrain::test::kOneJobYaml);
  std::string first_weights;
  std::map<std::string, nlohmann::json> summaries;  // by launch
  for (const std::string launch : {"threads", "processes", "cluster"}) {
    for (const std::string how : {"file", "flags"}) {
      SCOPED_TRACE(launch + " " + how);
      const fs::path weights_dir = dir_ / (launch + "-" + how);
      const std::string job = (how == "file" ? job_file.string() : pipetrain::test::kOneJobFlags) +
                              " --weights-dir " + weights_dir.string();
      expected["weights_dir"] = weights_dir.string();
      Result dry = Run("run --launch " + launch + " --dry-run " + job);
      ASSERT_EQ(dry.exit_code, 0) << dry.err;
      EXPECT_EQ(nlohmann::json::parse(dry.out), expected);

      const fs::path summary = dir_ / "summary.json", weights = dir_ / "weights.pt";
      Result r = Run("run -q --launch " + launch + " --summary " + summary.string() +
                     " --save-weights " + weights.string() + " " + job);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const auto j = nlohmann::json::parse(ReadFile(summary));
      nlohmann::json ran = expected;  // the coordinator gives a job a checkpoint.dir of its own
      if (launch == "cluster") ran["checkpoint"]["dir"] = "checkpoints/job-0001";
      EXPECT_EQ(j["config"], ran);
      EXPECT_EQ(j["per_stage"].size(), 2u);
      EXPECT_GT(j["final_loss"].get<double>(), 0);
      for (int rank = 0; rank < 2; ++rank) {
        EXPECT_TRUE(fs::exists(weights_dir / ("stage" + std::to_string(rank) + ".pt")));
      }
      const std::string trained = ReadFile(weights);
      ASSERT_FALSE(trained.empty());
      if (first_weights.empty()) first_weights = trained;
      EXPECT_TRUE(trained == first_weights) << "the trained weights differ from threads/file's";
      fs::remove(weights);
      summaries[launch] = j;
    }
  }
  ExpectOneSummarySchema(summaries);
}

TEST_F(CliTest, BadPartitionNamesTheLayers) {
  ExpectRejected("run --stages 0:2,3:7", "layer 2 (block1) belong to no stage");
  ExpectRejected("run --stages 0:3,2:8", "runs past the last layer 6");
  ExpectRejected("run --stages 0:a", "--stages (stages): expected a count, auto, \"0:2,2:7\"");
}

TEST_F(CliTest, TwoBWNeedsAtLeastAsManyMicroBatchesAsStages) {
  ExpectRejected("run --schedule 2bw --stages 4 --microbatches 2",
                 "2bw needs micro_batches >= stages: got m=2 < p=4");
}

TEST_F(CliTest, UnknownModelAndSchedule) {
  ExpectRejected("run --model resnet9000", "unknown model 'resnet9000'");
  ExpectRejected("run --schedule zigzag", "zigzag");
  ExpectRejected("run --optimizer lion", "unknown optimizer 'lion'");
}

TEST_F(CliTest, UnreadableDataAndTorchScript) {
  ExpectRejected("run --data bytes --data-path /nonexistent/corpus.txt", "/nonexistent/corpus.txt",
                 /*exit_code=*/3);  // NotFound: 3, as the CLI's
  ExpectRejected("run --data uint16", "data.path: required for data.kind uint16");
  const fs::path junk = Write("junk.pt", "this is not a TorchScript archive");
  ExpectRejected("run --torchscript " + junk.string(), "cannot load TorchScript model");
  ExpectRejected("run --torchscript /nonexistent/model.pt", "/nonexistent/model.pt");
}

TEST_F(CliTest, MalformedYamlAndEveryViolationListed) {
  ExpectRejected("run " + Write("broken.yaml", "model: {name: gpt\nsteps: [").string(), "not YAML");
  const std::string job =
      Write("bad.yaml",
            "steps: many\nmicrobatches: 0\nlearning_rate: 3\nmodel: {name: gpt, "
            "d_model: 30, n_heads: 4}\n")
          .string();
  ExpectRejected("run " + job, "steps: expected an integer, got 'many'");
  ExpectRejected("run " + job, "learning_rate: unknown key");
  // Type errors stop before semantic checks; semantic errors are all listed together.
  ExpectRejected("run " + Write("bad2.yaml",
                                "microbatches: 0\nsteps: 0\nmodel: {d_model: 30, "
                                "n_heads: 4}\n")
                              .string(),
                 "model.d_model (30) must be divisible by model.n_heads (4); ");
  ExpectRejected("run " + dir_.string() + "/bad2.yaml", "steps: must be >= 1, got 0");
}

TEST_F(CliTest, HelpAndUsageErrors) {
  Result help = Run("run --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("--schedule"));
  EXPECT_THAT(help.out, HasSubstr("--recompute"));
  // The learning-rate schedule's worked example (LearningRateSchedule.TheWorkedExample... checks
  // its numbers) and what decay_steps counts from.
  EXPECT_THAT(help.out, HasSubstr("0.0006 0.0012 0.0018 0.0024 0.003 0.003 0.002967"));
  EXPECT_THAT(help.out, HasSubstr("counted from the end of the warm-up (not from step 0)"));
  // `checkpoint` says where the checkpoint goes as it is written now (it once named the
  // weights_dir format that is gone).
  Result checkpoint = Run("checkpoint --help");
  EXPECT_EQ(checkpoint.exit_code, 0);
  EXPECT_THAT(checkpoint.out, HasSubstr("<checkpoint.dir>/step-N/"));
  EXPECT_THAT(checkpoint.out, ::testing::Not(HasSubstr("weights_dir")));
  Result unknown = Run("run --no-such-flag");
  EXPECT_EQ(unknown.exit_code, 2);
  Result none = Run("");
  EXPECT_EQ(none.exit_code, 2);
}

}  // namespace
