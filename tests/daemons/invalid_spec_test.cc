// Invalid job specs, submitted with the CLI to a real coordinator with one worker: each is
// refused with exit 2 and every violation listed, each starting with its field path; the
// gRPC status is INVALID_ARGUMENT; no job is created and the worker is never contacted.
//
// A spec is checked in two phases: the YAML reader (in the CLI: unknown keys, wrong types;
// nothing is sent) and the coordinator's validation (everything that needs no model and no
// data). Each phase lists all of its violations; a file that fails the first never reaches
// the second, since it has no spec to check. What needs the model or the data (a data file,
// a TorchScript file) is checked by the workers when they plan their stage: the job fails at
// once naming the field, and every worker is free again.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "jobspec/spec_yaml.h"
#include "pipetrain/v1/job_service.grpc.pb.h"
#include "tests/daemons/local_cluster.h"

namespace {

namespace v1 = ::pipetrain::v1;
namespace fs = std::filesystem;
using ::pipetrain::test::LocalCluster;
using ::pipetrain::test::ReadFile;
using ::pipetrain::test::Result;
using ::testing::HasSubstr;

// A valid spec (a GPT of 5 layers: embedding, block0, block1, final_norm, lm_head), one
// top-level key per entry; each case overrides some keys ("" removes one) or adds others.
const std::vector<std::pair<std::string, std::string>> kBase = {
    {"model", "{name: gpt, d_model: 16, n_heads: 2, n_layers: 2}"},
    {"schedule", "1f1b"},
    {"stages", "2"},
    {"microbatches", "2"},
    {"microbatch_size", "2"},
    {"steps", "2"},
};

std::string Spec(const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::string yaml;
  std::set<std::string> used;
  for (const auto& [key, value] : kBase) {
    std::string v = value;
    for (const auto& [k, o] : overrides) {
      if (k == key) {
        v = o;
        used.insert(k);
      }
    }
    if (!v.empty()) yaml += key + ": " + v + "\n";
  }
  for (const auto& [k, o] : overrides) {
    if (!used.count(k)) yaml += k + ": " + o + "\n";
  }
  return yaml;
}

struct Case {
  std::string name;
  std::string yaml;
  // The start of each violation the error must list, and no other.
  std::vector<std::string> violations;
  bool caught_by_cli = false;  // by the YAML reader: nothing is sent
};

std::vector<Case> Cases() {
  return {
      // The YAML reader.
      {"unknown key", Spec({{"stepz", "3"}}), {"stepz: unknown key (known: name, model,"}, true},
      {"unknown nested key",
       Spec({{"model", "{name: gpt, d_modell: 16, n_heads: 2, n_layers: 2}"}}),
       {"model.d_modell: unknown key"},
       true},
      {"wrong type", Spec({{"steps", "many"}}), {"steps: expected an integer, got 'many'"}, true},
      {"wrong nested type",
       Spec({{"optimizer", "{name: adamw, lr: fast}"}}),
       {"optimizer.lr: expected a number, got 'fast'"},
       true},
      {"negative seed",
       Spec({{"seed", "-1"}}),
       {"seed: expected a non-negative integer, got '-1'"},
       true},
      {"a section that is not a mapping",
       Spec({{"model", "gpt"}}),
       {"model: expected a mapping"},
       true},
      {"a job that is not a mapping", "- steps: 3\n", {"job: expected a mapping"}, true},
      {"stages neither a count nor ranges",
       Spec({{"stages", "0-2"}}),
       {"stages: expected a count, auto, \"0:2,2:7\" or [[0, 2], [2, 7]], got '0-2'"},
       true},
      {"every structural error at once",
       Spec({{"stepz", "3"}, {"microbatches", "lots"}, {"data", "{kind: synthetic, vocabb: 3}"}}),
       {"stepz: unknown key", "microbatches: expected an integer, got 'lots'",
        "data.vocabb: unknown key"},
       true},
      // The partition against the model's layers.
      {"more stages than layers",
       Spec({{"stages", "6"}}),
       {"stages: 6 stages for a model of 5 layers (embedding, block0, block1, final_norm, "
        "lm_head): each stage needs at least one layer"}},
      {"overlapping stage ranges",
       Spec({{"stages", "[[0, 3], [2, 5]]"}}),
       {"stages: stage 1 [2, 5) overlaps stage 0: layer 2 (block1) would be in both"}},
      {"a gap between stage ranges",
       Spec({{"stages", "[[0, 2], [3, 5]]"}}),
       {"stages: layer 2 (block1) belong to no stage"}},
      {"stage ranges out of order",
       Spec({{"stages", "[[2, 5], [0, 2]]"}}),
       {"stages: stage 1 [0, 2) starts before stage 0: stages must be in layer order"}},
      {"a stage of no layers",
       Spec({{"stages", "[[0, 2], [2, 2], [2, 5]]"}}),
       {"stages: stage 1 [2, 2) is empty or reversed"}},
      {"a stage past the last layer",
       Spec({{"stages", "0:2,2:7"}}),
       {"stages: stage 1 [2, 7) runs past the last layer 4 (the model has 5 layers)"}},
      {"zero stages", Spec({{"stages", "0"}}), {"stages: must be >= 1, got 0"}},
      {"recompute of a layer that does not exist",
       Spec({{"recompute", "layers:1,9"}}),
       {"recompute: layer 9 does not exist (the model has 5 layers)"}},
      // The schedule.
      {"no micro-batches", Spec({{"microbatches", "0"}}), {"microbatches: must be >= 1, got 0"}},
      {"2bw with fewer micro-batches than stages",
       Spec({{"schedule", "2bw"}, {"stages", "4"}, {"microbatches", "2"}}),
       {"schedule: 2bw needs micro_batches >= stages: got m=2 < p=4"}},
      {"unknown schedule",
       Spec({{"schedule", "zigzag"}}),
       {"schedule: unknown schedule kind 'zigzag', accepted: gpipe, 1f1b"}},
      // The model, the data, the optimizer.
      {"unknown model",
       Spec({{"model", "{name: resnet}"}}),
       {"model.name: unknown model 'resnet' (known: gpt, mlp, cnn, vgg, torchscript)"}},
      {"no layers",
       Spec({{"model", "{name: gpt, d_model: 16, n_heads: 2, n_layers: 0}"}}),
       {"model.n_layers: must be > 0, got 0"}},
      {"heads that do not divide the width",
       Spec({{"model", "{name: gpt, d_model: 30, n_heads: 4, n_layers: 2}"}}),
       {"model.d_model (30) must be divisible by model.n_heads (4)"}},
      {"dropout of 1.5",
       Spec({{"model", "{name: gpt, d_model: 16, n_heads: 2, n_layers: 2, dropout: 1.5}"}}),
       {"model.dropout: must be in [0, 1), got 1.5"}},
      {"unknown data kind",
       Spec({{"data", "{kind: images}"}}),
       {"data.kind: unknown 'images' (known: synthetic, bytes, uint16, classification)"}},
      {"token data for a classifier",
       Spec({{"model", "{name: mlp, hidden: 8, hidden_layers: 1, input_dim: 4, num_classes: 2}"},
             {"data", "{kind: synthetic}"}}),
       {"data.kind: model mlp needs feature data (classification), got synthetic"}},
      {"a data file not named",
       Spec({{"data", "{kind: bytes}"}}),
       {"data.path: required for data.kind bytes"}},
      {"unknown optimizer",
       Spec({{"optimizer", "{name: lion, lr: 0.01}"}}),
       {"optimizer.name: unknown optimizer 'lion' (known: sgd, adamw)"}},
      {"negative learning rate",
       Spec({{"optimizer", "{name: sgd, lr: -0.1}"}}),
       {"optimizer.lr: must be >= 0, got -0.1"}},
      // The rest of the job.
      {"no steps", Spec({{"steps", "0"}}), {"steps: must be >= 1, got 0"}},
      {"no replicas", Spec({{"replicas", "0"}}), {"replicas: must be >= 1, got 0"}},
      {"empty micro-batches",
       Spec({{"microbatch_size", "0"}}),
       {"microbatch_size: must be >= 1, got 0"}},
      {"unknown dtype",
       Spec({{"dtype", "float16"}}),
       {"dtype: expected float32, float64 or bfloat16, got 'float16'"}},
      {"unknown recompute",
       Spec({{"recompute", "sometimes"}}),
       {"recompute: expected none, all, stages:I,J,... or layers:I,J,..., got 'sometimes'"}},
      {"no time to wait", Spec({{"timeout_s", "0"}}), {"timeout_s: must be > 0, got 0"}},
      {"negative threads",
       Spec({{"threads_per_stage", "-1"}}),
       {"threads_per_stage: must be >= 0, got -1"}},
      {"empty gradient buckets", Spec({{"bucket_kib", "0"}}), {"bucket_kib: must be >= 1, got 0"}},
      {"an unknown device", Spec({{"device", "tpu"}}), {"device: expected cpu or cuda, got 'tpu'"}},
      {"an empty weights_dir",
       Spec({{"weights_dir", "\"\""}}),
       {"weights_dir: must not be empty when set"}},
      // Many at once: every one is listed.
      {"every semantic error at once",
       Spec({{"model", "{name: gpt, d_model: 30, n_heads: 4, n_layers: 2}"},
             {"schedule", "2bw"},
             {"stages", "[[0, 2], [3, 5]]"},
             {"microbatches", "1"},
             {"microbatch_size", "0"},
             {"steps", "0"},
             {"replicas", "0"},
             {"dtype", "float16"},
             {"optimizer", "{name: sgd, lr: -1}"},
             {"data", "{kind: synthetic, vocab: 1}"}}),
       {"model.d_model (30) must be divisible by model.n_heads (4)",
        "optimizer.lr: must be >= 0, got -1", "data.vocab: must be >= 2, got 1",
        "data.branching: must be in [1, vocab], got 4",
        "stages: layer 2 (block1) belong to no stage", "replicas: must be >= 1, got 0",
        "microbatch_size: must be >= 1, got 0", "steps: must be >= 1, got 0",
        "schedule: 2bw needs micro_batches >= stages: got m=1 < p=2",
        "dtype: expected float32, float64 or bfloat16, got 'float16'"}},
  };
}

// The violations in the CLI's error line "pipetrain: [submitting FILE: ]invalid job: a; b".
std::vector<std::string> Violations(const std::string& err) {
  const size_t at = err.find("invalid job: ");
  if (at == std::string::npos) return {};
  std::string list = err.substr(at + 13);
  while (!list.empty() && list.back() == '\n') list.pop_back();
  return absl::StrSplit(list, "; ");
}

// Starts with a field path of the job ("model.d_model", "stages", "job" for the whole of
// it), then ": " (or " (" for a value quoted after the path).
bool StartsWithFieldPath(const std::string& violation) {
  static const std::set<std::string> kKeys = {"job",
                                              "name",
                                              "model",
                                              "data",
                                              "schedule",
                                              "stages",
                                              "replicas",
                                              "overlap_allreduce",
                                              "bucket_kib",
                                              "microbatches",
                                              "microbatch_size",
                                              "steps",
                                              "optimizer",
                                              "recompute",
                                              "seed",
                                              "dtype",
                                              "threads_per_stage",
                                              "timeout_s",
                                              "weights_dir",
                                              "device"};
  static const std::regex kPath(
      "^([a-z_0-9]+)(\\[[0-9]*\\])*(\\.[a-z_0-9]+(\\[[0-9]*\\])*)*(/[a-z_0-9]+)?(: | \\()");
  std::smatch m;
  if (!std::regex_search(violation, m, kPath)) return false;
  // An unknown key is its own path; any other starts with a key of the job.
  return kKeys.count(m[1].str()) > 0 || violation.compare(m[0].length(), 12, "unknown key ") == 0;
}

class InvalidSpecTest : public ::pipetrain::test::DaemonTest {};

TEST_F(InvalidSpecTest, EveryKindIsRefusedWithEveryViolationAndNothingRuns) {
  LocalCluster cluster(dir_, 1);
  ASSERT_FALSE(cluster.address().empty());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(1));
  auto stub = cluster.JobStub();
  const std::vector<Case> cases = Cases();
  ASSERT_GE(cases.size(), 15u);
  std::vector<std::string> files, submits;
  for (size_t i = 0; i < cases.size(); ++i) {
    files.push_back(Write("case" + std::to_string(i) + ".yaml", cases[i].yaml).string());
    submits.push_back("submit " + files.back());
  }
  const std::vector<Result> results = cluster.CliAll(submits);
  std::set<std::string> names;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const Result& r = results[i];
    const std::string& file = files[i];
    SCOPED_TRACE(c.name + ":\n" + c.yaml);
    EXPECT_TRUE(names.insert(c.name).second) << "cases are distinct";
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    const std::vector<std::string> listed = Violations(r.err);
    EXPECT_EQ(listed.size(), c.violations.size()) << r.err;
    for (const std::string& expected : c.violations) {
      EXPECT_THAT(listed, ::testing::Contains(::testing::StartsWith(expected))) << r.err;
    }
    for (const std::string& v : listed) {
      EXPECT_TRUE(StartsWithFieldPath(v)) << "no field path: '" << v << "'";
    }
    // The same spec through the API: the CLI's reader refuses it before any call, or the
    // coordinator answers INVALID_ARGUMENT with the very message the CLI printed.
    absl::StatusOr<v1::JobSpec> spec = ::pipetrain::jobspec::JobSpecFromYaml(c.yaml);
    if (c.caught_by_cli) {
      ASSERT_FALSE(spec.ok());
      EXPECT_EQ(r.err, "pipetrain: " + file + ": " + std::string(spec.status().message()) + "\n");
      continue;
    }
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_THAT(r.err, ::testing::StartsWith("pipetrain: submitting " + file + ": "));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = *spec;
    v1::Job job;
    const grpc::Status s = stub->SubmitJob(&ctx, request, &job);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_EQ("pipetrain: submitting " + file + ": " + s.error_message() + "\n", r.err);
    EXPECT_EQ(job.id(), "");
  }

  // A spec too large to send (a 10 MB name) is refused as invalid, naming the field, not with
  // gRPC's message-size error.
  {
    const std::string file =
        Write("huge-name.yaml", Spec({{"name", std::string(10 << 20, 'n')}})).string();
    const Result huge = cluster.Cli("submit " + file);
    EXPECT_EQ(huge.exit_code, 2) << huge.err.substr(0, 300);
    EXPECT_THAT(huge.err, HasSubstr("name: must be at most 256 bytes"));
    EXPECT_LT(huge.err.size(), 1000u);
  }

  // Nothing was queued, no event kept, the worker never asked; the coordinator still serves.
  Result list = cluster.Cli("list -o json");
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(list.out, "");
  Result health = cluster.Cli("health");
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_THAT(health.out, HasSubstr("serving"));
  const std::string worker_log = ReadFile(cluster.worker_log(0));
  EXPECT_THAT(worker_log, HasSubstr("registered as worker-1"));
  EXPECT_THAT(worker_log, ::testing::Not(HasSubstr("running rank")));
  EXPECT_THAT(ReadFile(cluster.coordinator_log()), ::testing::Not(HasSubstr("job-0")));
  const auto workers = cluster.Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].value("state", ""), "WORKER_STATE_IDLE");

  // The spec the cases start from is valid: it runs (its two stages on two workers), and is
  // the first job.
  cluster.StartWorker();
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  Result valid = cluster.Cli("submit " + Write("valid.yaml", Spec({})).string() + " --follow");
  EXPECT_EQ(valid.exit_code, 0) << valid.out << valid.err;
  EXPECT_THAT(valid.out, HasSubstr("job-0001 succeeded"));
}

// What only a worker can check (the data, the model file, its output directory) and what
// fails while writing (a full disk) fails the job with its cause, naming the field; the
// workers stay up and take the next job.
TEST_F(InvalidSpecTest, WhatNeedsTheDataOrTheModelFailsOnTheWorkersNamingTheField) {
  LocalCluster cluster(dir_, 2);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  struct Case {
    std::string yaml, field;
  };
  std::vector<Case> cases = {
      {Spec({{"data", "{kind: bytes, path: /nonexistent/corpus.txt}"}}), "data.path: cannot open"},
      {Spec({{"model", "{name: torchscript, path: /nonexistent/model.pt}"},
             {"data", "{kind: classification}"}}),
       "model.path: cannot open /nonexistent/model.pt"},
      // An output directory that cannot be made: refused before the first step.
      {Spec({{"weights_dir", Write("a-file", "").string() + "/weights"}}),
       "weights_dir: cannot create"},
  };
  // A full disk when the weights are written at the end (LibTorch's writer once took the
  // worker process down with it): the job fails with the cause, the workers stay.
  const fs::path full = dir_ / "full";
  fs::create_directories(full);
  const bool have_full_disk =
      geteuid() == 0 &&
      cluster.Shell("mount -t tmpfs -o size=32k tmpfs " + full.string()).exit_code == 0;
  if (have_full_disk) {
    cases.push_back({Spec({{"weights_dir", (full / "w").string()},
                           {"model", "{name: gpt, d_model: 64, n_heads: 2, n_layers: 2}"}}),
                     "No space left on device"});
  } else {
    std::fprintf(stderr, "note: no tmpfs to fill (not root?): the full-disk case is left out\n");
  }
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    const auto started = std::chrono::steady_clock::now();
    Result r = cluster.Cli(
        "submit " + Write("job" + std::to_string(n++) + ".yaml", c.yaml).string() + " --follow");
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;  // accepted, then failed: not a usage error
    EXPECT_THAT(r.out + r.err, HasSubstr(c.field));
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
    // Nothing is left running: both workers take the next job at once.
    EXPECT_TRUE(cluster.WaitForIdleWorkers(2, std::chrono::seconds(10)));
  }
  if (have_full_disk) cluster.Shell("umount " + full.string());
  Result valid = cluster.Cli("submit " + Write("valid.yaml", Spec({})).string() + " --follow");
  EXPECT_EQ(valid.exit_code, 0) << valid.out << valid.err;
  EXPECT_THAT(valid.out, HasSubstr("job-000" + std::to_string(n + 1) + " succeeded"));
  // The same two workers ran every job: none died and registered again.
  EXPECT_EQ(cluster.Workers().size(), 2u);
}

}  // namespace

namespace {

// device: cuda where no GPU is visible. The coordinator takes the job but runs it only on
// workers registered on a GPU: with CPU workers alone it waits, saying what for (and a CPU
// job runs meanwhile). A worker asked for a GPU this machine does not show will not start.
TEST_F(InvalidSpecTest, ACudaJobWaitsForGpuWorkersAndAWorkerWithoutItsGpuDoesNotStart) {
  if (fs::exists("/dev/nvidia0")) GTEST_SKIP() << "this machine has a GPU";
  LocalCluster cluster(dir_, 2);
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2));
  Result queued = cluster.Cli("submit " + Write("gpu.yaml", Spec({{"device", "cuda"}})).string());
  ASSERT_EQ(queued.exit_code, 0) << queued.err;
  const nlohmann::json waiting = cluster.WaitForJob("job-0001", [](const nlohmann::json& j) {
    return j.value("message", "").find("on cuda") != std::string::npos;
  });
  ASSERT_FALSE(waiting.is_null());
  EXPECT_EQ(waiting.value("state", ""), "JOB_STATE_QUEUED");
  EXPECT_THAT(waiting.value("message", ""),
              HasSubstr("needs 2 workers on cuda; the pool has 0 such (of 2)"));
  Result cpu = cluster.Cli("submit " + Write("cpu.yaml", Spec({})).string() + " --follow");
  EXPECT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  EXPECT_EQ(cluster.Cli("cancel job-0001").exit_code, 0);

  Result worker = cluster.Shell(std::string(LocalCluster::worker_path()) + " --coordinator " +
                                cluster.address() + " --device cuda");
  EXPECT_EQ(worker.exit_code, 2);
  EXPECT_THAT(worker.err, HasSubstr("--device cuda: this process sees 0 CUDA devices"));
  Result bad = cluster.Shell(std::string(LocalCluster::worker_path()) + " --coordinator " +
                             cluster.address() + " --device tpu");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--device tpu: expected cpu, cuda or cuda:N"));
}

}  // namespace
