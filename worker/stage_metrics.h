// The Prometheus series of the rank a worker runs, labelled job_id, pp_stage, dp_replica and
// worker (docs/metrics.md lists them). Counters and gauges are fetched once, when the rank
// starts; the stage's thread then only adds to atomics (OnAction, OnStep), so a scrape never
// holds it up. What the stage is doing now (its action, stash, live weight versions) is read
// from its handle at scrape time (job::StageHandle: nothing while no executor runs), until
// this object goes. The counters and gauges stay
// after it (a scrape after the job ended still sees its final values) until
// ForgetJob(job_id), which the worker calls when its next rank starts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/metrics.h"
#include "pipetrain/v1/job.pb.h"
#include "runtime/executor/stage_executor.h"
#include "runtime/job/launch/stage_handle.h"

namespace pipetrain::worker {

struct StageMetricsLabels {
  std::string job_id;
  int stage = 0, replica = 0;
  std::string worker;
};

// Where the stage's time went, totals since it started (seconds): what its counters hold,
// kept as plain numbers on the stage's thread for its step reports.
struct StageTimes {
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  double receive_forward_s = 0, receive_backward_s = 0;
  double send_forward_s = 0, send_backward_s = 0;
  double exposed_allreduce_s = 0;
  double last_step_bubble_ratio = 0, last_step_s = 0;  // 0 before the second step
};

// The same times as step reports carry them (the coordinator checks and shows them).
v1::StageBreakdown ToBreakdown(const StageTimes& times);

class StageMetrics {
 public:
  // `samples_per_step`: rows of this replica per step (m x b); `tokens_per_sample`: seq_len
  // for token data, else 0 (no token counter); `handle`: the rank whose activity a scrape
  // reads.
  StageMetrics(metrics::Registry* registry, const StageMetricsLabels& labels,
               int64_t samples_per_step, int64_t tokens_per_sample, bool last_stage,
               std::shared_ptr<const job::StageHandle> handle);
  ~StageMetrics();
  // Removes every series of `job_id` from `registry`.
  static void ForgetJob(metrics::Registry* registry, const std::string& job_id);
  StageMetrics(const StageMetrics&) = delete;
  StageMetrics& operator=(const StageMetrics&) = delete;

  // The stage's thread.
  void OnAction(const executor::ActionRecord& record);
  void OnStep(const executor::StepRecord& step);
  // The stage's thread: the totals as of its last OnAction / OnStep.
  const StageTimes& times() const { return times_; }

 private:
  metrics::Registry* registry_;
  StageMetricsLabels labels_;
  int64_t samples_per_step_, tokens_per_sample_;
  bool last_stage_;
  metrics::Counter *steps_, *samples_, *tokens_ = nullptr;
  metrics::Counter *compute_forward_, *compute_backward_, *compute_optimizer_;
  metrics::Counter *receive_forward_, *receive_backward_, *send_forward_, *send_backward_;
  metrics::Counter* exposed_allreduce_;
  metrics::Counter *sent_activation_, *sent_gradient_, *received_activation_, *received_gradient_;
  metrics::Histogram* step_duration_;
  metrics::Gauge *bubble_, *last_step_time_, *loss_ = nullptr;
  metrics::Gauge* grad_norm_ = nullptr;  // made at the first step with a norm (clipping)
  // The stage's thread only: the previous step's end and totals.
  double previous_end_s_ = -1, previous_compute_s_ = 0;
  StageTimes times_;
  const std::shared_ptr<const job::StageHandle> handle_;  // read by scrapes, any thread
  std::vector<int> collectors_;  // removed first thing when this object goes
};

}  // namespace pipetrain::worker
