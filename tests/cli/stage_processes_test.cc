// The runner's stage processes (--launch processes) as users run them: every example job,
// results equal to the reference, checkpoint and resume on another layout, and no process
// left behind when a stage is killed or the launcher interrupted.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/schedule/schedule.h"
#include "tests/cli/cli_fixture.h"
#include "tests/pipeline/schedule_cases.h"

using namespace pipetrain::cli_test;  // NOLINT: the fixture's helpers
namespace pipeline_test = pipetrain::job::pipeline_test;
namespace schedule = pipetrain::schedule;

namespace {

// Every example job in examples/ is valid and runs (two steps each).
TEST_F(CliTest, EveryExampleJobRuns) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(PIPETRAIN_SOURCE_DIR) / "examples")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    const fs::path summary = dir_ / "summary.json";
    Result r = Run("run " + entry.path().string() + " --steps 2 -q --summary " + summary.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(ReadFile(summary))["losses"].size(), 2u);
    ++count;
  }
  EXPECT_GE(count, 6);
}

}  // namespace

namespace {

// One OS process per rank over Gloo: the same parameters as the un-pipelined reference, for
// every kind of schedule (the one list, tests/pipeline/schedule_cases.h), 1 and 2 replicas.
// Kinds whose ranks hold one stage run 2 and 4 stages; kinds with chunks run 2 ranks of their
// default chunks, and of 2 where that default is 1 (zb1p's ZB-H1 and its interleaved form),
// so two ranks exchange the tensors of several stage boundaries.
TEST_F(CliTest, ProcessesOfEveryScheduleMatchTheReference) {
  struct Layout {
    int ranks, virtual_stages;  // 0: the kind's default
  };
  for (const pipeline_test::ScheduleCase& k : pipeline_test::EveryScheduleKind(2)) {
    std::vector<Layout> layouts = {{k.stages, k.virtual_stages}};
    if (!schedule::HoldsChunks(k.kind)) layouts.push_back({4, 0});
    if (schedule::HoldsChunks(k.kind) && schedule::DefaultVirtualStages(k.kind) == 1) {
      layouts.push_back({2, 2});
    }
    for (const Layout& layout : layouts) {
      const int chunks = layout.virtual_stages > 0 ? layout.virtual_stages
                                                   : schedule::DefaultVirtualStages(k.kind);
      for (const int replicas : {1, 2}) {
        const std::string name(schedule::ScheduleKindName(k.kind));
        SCOPED_TRACE(name + " ranks " + std::to_string(layout.ranks) + " x " +
                     std::to_string(chunks) + " replicas " + std::to_string(replicas));
        const fs::path summary = dir_ / "summary.json";
        const std::string command =
            "run -q --launch processes --reference --dtype float64 --schedule " + name +
            LayoutFlags(layout.ranks, layout.virtual_stages) + " --replicas " +
            std::to_string(replicas);
        Result r = Run(command +
                       " --microbatches 4 --steps 3 --d-model 16 --n-heads 2 --n-layers 3"
                       " --seq-len 8 --vocab 16 --summary " +
                       summary.string());
        ASSERT_EQ(r.exit_code, 0) << r.err;
        auto j = nlohmann::json::parse(ReadFile(summary));
        EXPECT_EQ(j["schedule"], name);
        EXPECT_EQ(j["stages"], layout.ranks);
        EXPECT_EQ(j["replicas"], replicas);
        EXPECT_EQ(j["partition"].size(), static_cast<size_t>(layout.ranks * chunks));
        EXPECT_EQ(j["per_stage"][0]["model_stage_layers"].size(),
                  static_cast<size_t>(chunks > 1 ? chunks : 0));
        EXPECT_LE(j["max_param_rel_diff"].get<double>(), 1e-10);
        EXPECT_EQ(j["losses"].size(), 3u);
      }
    }
  }
}

// A GPT whose LM head is tied to its embedding, 3 stage processes x 2 replicas: the copies on
// ranks 0 and 2 of each replica exchange their gradients over Gloo; the parameters equal the
// reference with one parameter.
TEST_F(CliTest, TiedEmbeddingsAcrossProcessesMatchTheReference) {
  const fs::path summary = dir_ / "summary.json";
  Result r =
      Run("run -q --launch processes --reference --dtype float64 --schedule 1f1b "
          "--tie-embeddings true --stages 3 --replicas 2 --microbatches 4 --steps 3 "
          "--d-model 16 --n-heads 2 --n-layers 3 --seq-len 8 --vocab 16 --summary " +
          summary.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(ReadFile(summary));
  EXPECT_LE(j["max_param_rel_diff"].get<double>(), 1e-10);
  EXPECT_EQ(j["config"]["model"]["tie_embeddings"], true);
}

// The group collectives as stage processes over Gloo (the pipeline's group, some of its stages,
// the replicas): clipping by the pipeline's norm, tied embeddings whose copies sit on the first
// and last of 4 ranks, the schedules with chunks with both, and 2BW evaluating. Float64: the
// parameters within 1e-10 of the un-pipelined reference (clip_grad_norm_ over the whole model,
// a tie once; tests/pipeline/clip_grad_norm_test has the negative controls), the norms and
// the evaluation's figures those of the same job with its stages as threads (the in-process
// transport's collectives).
TEST_F(CliTest, GroupCollectivesAcrossProcessesMatchTheReference) {
  const std::string model =
      " --microbatches 4 --steps 4 --d-model 16 --n-heads 2 --n-layers 3 --seq-len 8 --vocab 16"
      " --dtype float64 --clip-grad-norm 0.5";
  for (const std::string job : {"--schedule 1f1b --stages 4 --replicas 2 --tie-embeddings true",
                                "--schedule interleaved --stages 2 --tie-embeddings true",
                                "--schedule zbv --stages 2 --replicas 2 --tie-embeddings true",
                                "--schedule dualpipev --stages 2 --tie-embeddings true",
                                "--schedule 2bw --stages 4 --eval-every 2 --eval-split 0.25"}) {
    SCOPED_TRACE(job);
    const fs::path processes = dir_ / "processes.json", threads = dir_ / "threads.json";
    Result r = Run("run -q --launch processes --reference " + job + model + " --summary " +
                   processes.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Result t = Run("run -q --launch threads " + job + model + " --summary " + threads.string());
    ASSERT_EQ(t.exit_code, 0) << t.err;
    auto p = nlohmann::json::parse(ReadFile(processes));
    auto q = nlohmann::json::parse(ReadFile(threads));
    EXPECT_LE(p["max_param_rel_diff"].get<double>(), 1e-10);
    ASSERT_EQ(p["grad_norms"].size(), 4u);
    ASSERT_EQ(p["grad_norms"].size(), q["grad_norms"].size());
    for (size_t k = 0; k < p["grad_norms"].size(); ++k) {
      const double a = p["grad_norms"][k].get<double>(), b = q["grad_norms"][k].get<double>();
      EXPECT_NEAR(a, b, 1e-12 * b) << "step " << k;
    }
    ASSERT_EQ(p["evals"].size(), q["evals"].size());
    for (size_t k = 0; k < p["evals"].size(); ++k) {
      EXPECT_NEAR(p["evals"][k]["loss"].get<double>(), q["evals"][k]["loss"].get<double>(), 1e-12)
          << "evaluation " << k;
    }
    if (job.find("eval") != std::string::npos) {
      EXPECT_EQ(p["evals"].size(), 2u);
    }
  }
}

// Stage processes write a checkpoint (each its layers, one commits through the launcher's
// store): a 3-step job with a checkpoint policy writes its final one, after its last step
// (the policy's every 3 has no boundary in 3 steps), and a 6-step job resumes from it,
// named by the `latest` pointer file itself, on another layout: 4 stages, then 2 stages x 2
// replicas; the final parameters equal the uninterrupted reference within 1e-10 (float64).
TEST_F(CliTest, StageProcessesCheckpointAndResumeOnAnotherLayout) {
  const std::string common =
      " --dtype float64 --schedule 1f1b --d-model 16 --n-heads 2 --n-layers 3"
      " --seq-len 8 --vocab 16 --checkpoint-dir " +
      (dir_ / "ckpt").string();
  Result first =
      Run("run -q --launch processes --stages 4 --microbatches 4 --steps 3 "
          "--checkpoint-every 3" +
          common);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(ReadFile(dir_ / "ckpt" / "latest"), "step-00000003\n");
  const fs::path summary = dir_ / "summary.json";
  Result resumed =
      Run("run -q --launch processes --reference --stages 2 --replicas 2 "
          "--microbatches 2 --steps 6 --resume-from " +
          (dir_ / "ckpt" / "latest").string() + " --summary " + summary.string() + common);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.err, HasSubstr("resuming at step 3 from " + (dir_ / "ckpt").string()));
  auto j = nlohmann::json::parse(ReadFile(summary));
  EXPECT_EQ(j["first_step"], 3);
  EXPECT_EQ(j["losses"].size(), 3u);
  EXPECT_LE(j["max_param_rel_diff"].get<double>(), 1e-10);
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string stat = ReadFile(entry.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) children.push_back(std::stoi(name));
  }
  return children;
}

std::string CommandLine(pid_t pid) {
  std::string cmd = ReadFile(fs::path("/proc") / std::to_string(pid) / "cmdline");
  std::replace(cmd.begin(), cmd.end(), '\0', ' ');
  return cmd;
}

// A stage process killed mid-step: every other stage stops, the launcher exits non-zero
// within 10 s naming the dead stage, and no process is left behind.
TEST_F(CliTest, KilledStageProcessStopsTheJobAndLeavesNothingBehind) {
  const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const std::string command =
        std::string("exec ") + PIPETRAIN_CLI +
        " run --launch processes --stages 4 --steps 2000 --peer-timeout 60 >" + out.string() +
        " 2>" + err.string();
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait for training to be under way, then kill stage 1.
  pid_t victim = -1;
  std::vector<pid_t> stages;
  for (int i = 0; i < 600 && victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (ReadFile(err).find("step 1/") == std::string::npos) continue;
    stages = ChildrenOf(launcher);
    for (pid_t child : stages) {
      if (CommandLine(child).find("--stage-process 1 ") != std::string::npos) victim = child;
    }
  }
  ASSERT_GT(victim, 0) << ReadFile(err);
  ASSERT_EQ(stages.size(), 4u);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  if (done == 0) kill(launcher, SIGKILL);
  ASSERT_EQ(done, launcher) << "the launcher did not stop";
  EXPECT_LT(seconds, 10.0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string error = ReadFile(err);
  EXPECT_THAT(error,
              HasSubstr("stage 1 (pid " + std::to_string(victim) + ") was killed by signal 9"));
  EXPECT_THAT(error, HasSubstr("lost stage 1 (rank 1)"));
  for (pid_t pid : stages) {
    EXPECT_NE(kill(pid, 0), 0) << "stage process " << pid << " is still there";
  }
}

}  // namespace

namespace {

// Ctrl-C on the launcher: it exits 130 and takes every stage process with it.
TEST_F(CliTest, InterruptedLauncherTakesItsStageProcessesWithIt) {
  const fs::path err = dir_ / "stderr";
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    const std::string command = std::string("exec ") + PIPETRAIN_CLI +
                                " run --launch processes --stages 2 --steps 2000 2>" +
                                err.string() + " >/dev/null";
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::vector<pid_t> stages;
  for (int i = 0; i < 600 && stages.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (ReadFile(err).find("step 1/") != std::string::npos) stages = ChildrenOf(launcher);
  }
  ASSERT_EQ(stages.size(), 2u) << ReadFile(err);
  ASSERT_EQ(kill(launcher, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 130);
  bool gone = false;
  for (int i = 0; i < 50 && !gone; ++i) {
    gone = true;
    for (pid_t pid : stages) gone = gone && kill(pid, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(gone) << "stage processes outlived the launcher";
}

}  // namespace
