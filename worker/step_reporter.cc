#include "worker/step_reporter.h"

#include <algorithm>

#include "jobspec/step_commands.h"
#include "runtime/base/process_memory.h"

namespace pipetrain::worker {

v1::StepReport MakeStepReport(const v1::StageAssignment& a, const std::string& worker_id,
                              const executor::StepRecord& step, int64_t parameter_bytes,
                              int64_t peak_tensor_bytes, model::LayerRange layers,
                              const v1::StageBreakdown& breakdown, StepNews news) {
  v1::StepReport report;
  report.set_worker_id(worker_id);
  report.set_job_id(a.job_id());
  report.set_rank(a.rank());
  report.set_generation(a.generation());
  report.set_step(step.step);
  report.set_checkpoint_committed(news.committed_checkpoint);
  report.set_checkpoint_failed(news.failed_checkpoint.substr(0, 1024));
  report.set_state_from_replicas(news.state_from_replicas.substr(0, 1024));
  if (!news.resumed_from.empty()) {
    report.set_resumed_from(news.resumed_from.substr(0, 4096));
    for (size_t i = 0; i < news.passed_over.size() && i < 16; ++i) {
      report.add_passed_over(news.passed_over[i].substr(0, 1024));
    }
  }
  if (step.mean_loss) {
    report.set_has_loss(true);
    report.set_loss(*step.mean_loss);
  }
  if (step.job_loss) {
    report.set_has_job_loss(true);
    report.set_job_loss(*step.job_loss);
  }
  if (step.grad_norm) {
    report.set_has_grad_norm(true);
    report.set_grad_norm(*step.grad_norm);
  }
  if (step.eval) {
    report.set_has_eval(true);
    report.set_eval_loss(step.eval->loss);
    report.set_eval_accuracy(step.eval->accuracy);
  }
  report.set_end_s(step.end_s);
  report.set_skipped(step.skipped);
  report.set_compute_s(step.compute_s);
  report.set_wait_s(step.wait_s);
  report.set_parameter_bytes(parameter_bytes);
  report.set_peak_tensor_bytes(std::max<int64_t>(0, peak_tensor_bytes));
  report.set_layers_begin(layers.begin);
  report.set_layers_end(layers.end);
  *report.mutable_breakdown() = breakdown;
  for (v1::StepCommand c : jobspec::StepCommandsOf(step.commands_after)) {
    report.add_commands_after(c);
  }
  return report;
}

void StepReporter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto last_sent = std::chrono::steady_clock::now() - kMinInterval;
  bool unanswered = false;  // the last batch got no answer
  while (true) {
    cv_.wait(lock, [this] { return closing_ || !queue_.empty(); });
    if (queue_.empty()) return;
    // A coordinator out of reach refuses at once: however full the queue, the next try waits
    // its turn (no tight loop of refused calls while the coordinator is away).
    if (unanswered) cv_.wait_until(lock, last_sent + kMinInterval, [this] { return abandoned_; });
    cv_.wait_until(lock, last_sent + kMinInterval,
                   [this] { return closing_ || queue_.size() >= kMaxBatch; });
    // At most kMaxBatch a call (the coordinator takes requests of about 1 MiB).
    v1::StepReports batch;
    while (!queue_.empty() && static_cast<size_t>(batch.reports_size()) < kMaxBatch) {
      *batch.add_reports() = std::move(queue_.front());
      queue_.pop_front();
    }
    room_.notify_all();
    lock.unlock();
    // The process's memory high-water, read here (once per batch) rather than on the
    // stage's thread at every step.
    const int64_t peak_memory = PeakResidentMemoryBytes();
    for (v1::StepReport& r : *batch.mutable_reports()) r.set_peak_memory_bytes(peak_memory);
    const absl::StatusOr<v1::ReportResponse> sent = coordinator_->ReportSteps(batch);
    if (sent.ok() && sent->stop()) on_stop_();
    last_sent = std::chrono::steady_clock::now();
    lock.lock();
    // Not taken for want of an answer: sent again, in order, with the next batch (the
    // coordinator skips reports it has counted already). Refused ones are not resent, and
    // neither is anything once the reporter has been closing for kClosingPatience: a
    // coordinator out of reach must not keep the stage from ending.
    unanswered = IsTransient(sent.status());
    if (unanswered && !abandoned_ && !(closing_ && std::chrono::steady_clock::now() >= close_by_)) {
      // Back at the front, never trimmed: a gap would be refused with every report after
      // it. The queue may hold a batch more than kMaxQueued meanwhile; Add waits for room.
      for (int i = batch.reports_size() - 1; i >= 0; --i) {
        queue_.push_front(std::move(*batch.mutable_reports(i)));
      }
    }
  }
}

}  // namespace pipetrain::worker
