// The pipeline tests' shared helpers: a tiny GPT job, runs of it in process (whole, or its
// stages built and changed first) and by the un-pipelined reference trainer that fail the
// test on an error, and a bitwise comparison of parameters. Each call runs on the calling
// thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/job/launch/in_process.h"
#include "runtime/job/plan.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/schedule/schedule.h"
#include "runtime/transport/in_process/in_process_transport.h"
#include "tests/pipeline/schedule_cases.h"

namespace pipetrain::job::pipeline_test {

using schedule::ActionKind;
using schedule::ScheduleKind;

// A TorchScript model (the file at `path`: an nn.Sequential of 4 children, 32 inputs, 10
// classes) on 3 ranks ({0, 2}, {2, 3}, {3, 4}), 1F1B, float32, on classification data.
inline JobSpec ScriptJob(const std::string& path) {
  JobSpec c;
  c.mutable_model()->set_name("torchscript");
  c.mutable_model()->set_path(path);
  c.mutable_data()->set_kind("classification");
  c.mutable_data()->set_num_samples(1024);
  SetSchedule(c, ScheduleKind::kOneFOneB);
  SetStageRanges(c, {{0, 2}, {2, 3}, {3, 4}});
  c.set_stages(3);
  c.set_microbatches(4);
  c.set_microbatch_size(4);
  c.set_steps(5);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("adamw");
  c.mutable_optimizer()->set_lr(1e-2);
  c.set_threads_per_stage(1);
  return c;
}

// A 2-block GPT (5 layers) small enough to train a few steps in well under a second.
inline JobSpec TinyGpt(ScheduleKind kind, int stages, int m) {
  JobSpec c;
  c.mutable_model()->set_name("gpt");
  c.mutable_model()->set_d_model(16);
  c.mutable_model()->set_n_heads(2);
  c.mutable_model()->set_n_layers(3);  // 6 layers: embedding, block0..2, final_norm, lm_head
  c.mutable_data()->set_vocab(16);
  c.mutable_data()->set_seq_len(8);
  c.mutable_data()->set_num_tokens(1 << 14);
  SetSchedule(c, kind);
  c.set_stages(stages);
  c.set_microbatches(m);
  c.set_microbatch_size(2);
  c.set_steps(5);
  c.clear_optimizer();
  c.mutable_optimizer()->set_name("sgd");
  c.mutable_optimizer()->set_lr(0.05);
  c.mutable_optimizer()->set_momentum(0.9);
  SetPrecision(c, pipetrain::job::Precision::kFloat64);
  c.set_threads_per_stage(1);
  c.set_timeout_s(60);
  return c;
}

// TinyGpt under `k`, m micro-batches.
inline JobSpec TinyGpt(const ScheduleCase& k, int m) {
  JobSpec c = TinyGpt(k.kind, k.stages, m);
  c.set_virtual_stages(k.virtual_stages);
  return c;
}

// RunInProcess(c), failing the test (and returning an empty report) on an error.
inline JobReport MustRun(const JobSpec& c) {
  auto report = RunInProcess(c);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : JobReport{};
}

// TrainReference(c), failing the test (and returning no tensors) on an error.
inline std::vector<at::Tensor> MustReference(const JobSpec& c) {
  auto ref = TrainReference(c);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? *std::move(ref) : std::vector<at::Tensor>{};
}

// One replica's stages built from `c` and changed by `adjust` (a limit, a fault), run as
// threads of this process over the in-process transport; kept for inspection.
struct StagesRun {
  std::unique_ptr<JobPlan> plan;
  std::unique_ptr<MicroBatchReader> reader;
  std::vector<StageParts> parts;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<executor::StageExecutor>> executors;
  std::vector<absl::Status> results;  // of each stage's Run()
};

// Fails the test (leaving `run` partly built) if a stage cannot be built.
inline void RunStages(const JobSpec& c, const std::function<void(StageParts&)>& adjust,
                      StagesRun& run) {
  absl::StatusOr<JobPlan> plan = MakeJobPlan(c);
  ASSERT_TRUE(plan.ok()) << plan.status();
  run.plan = std::make_unique<JobPlan>(*std::move(plan));
  run.reader = std::make_unique<MicroBatchReader>(*run.plan, c.microbatches());
  auto hub = transport::MakeInProcessHub();
  const int p = run.plan->ranks();
  for (int s = 0; s < p; ++s) {
    absl::StatusOr<StageParts> built = BuildStage(c, *run.plan, *run.reader, s);
    ASSERT_TRUE(built.ok()) << built.status();
    run.parts.push_back(std::move(*built));
    adjust(run.parts.back());
    run.transports.push_back(transport::MakeInProcessTransport(hub, s, p, 0, 1));
    run.executors.push_back(std::make_unique<executor::StageExecutor>(
        run.parts.back().config, run.parts.back().weight_stores(), run.transports.back().get()));
  }
  run.results.resize(p);
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&run, s] { run.results[s] = run.executors[s]->Run(); });
  }
  for (auto& t : threads) t.join();
}

// Whether `a` and `b` hold the same tensors, bit for bit.
inline bool BitwiseEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

}  // namespace pipetrain::job::pipeline_test
