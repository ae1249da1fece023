// The pipeline tests' shared helpers (one binary, pipeline_test): a tiny GPT job, runs of it
// in process and by the un-pipelined reference trainer that fail the test on an error, and a
// bitwise comparison of parameters. Each call runs on the calling thread and owns nothing.
#pragma once

#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/job/launch/in_process.h"
#include "runtime/job/reference/reference_trainer.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::job::pipeline_test {

using schedule::ActionKind;
using schedule::ScheduleKind;

// A 2-block GPT (5 layers) small enough to train a few steps in well under a second.
inline JobConfig TinyGpt(ScheduleKind kind, int stages, int m) {
  JobConfig c;
  c.model.name = "gpt";
  c.model.d_model = 16;
  c.model.n_heads = 2;
  c.model.n_layers = 3;  // 6 layers: embedding, block0..2, final_norm, lm_head
  c.data.vocab = 16;
  c.data.seq_len = 8;
  c.data.num_tokens = 1 << 14;
  c.schedule = kind;
  c.stages = stages;
  c.micro_batches = m;
  c.micro_batch_size = 2;
  c.steps = 5;
  c.optimizer = {"sgd", 0.05};
  c.optimizer.momentum = 0.9;
  c.precision = pipetrain::job::Precision::kFloat64;
  c.threads_per_stage = 1;
  c.recv_timeout_s = 60;
  return c;
}

// RunInProcess(c), failing the test (and returning an empty report) on an error.
inline JobReport MustRun(const JobConfig& c) {
  auto report = RunInProcess(c);
  EXPECT_TRUE(report.ok()) << report.status();
  return report.ok() ? *std::move(report) : JobReport{};
}

// TrainReference(c), failing the test (and returning no tensors) on an error.
inline std::vector<at::Tensor> MustReference(const JobConfig& c) {
  auto ref = TrainReference(c);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return ref.ok() ? *std::move(ref) : std::vector<at::Tensor>{};
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
