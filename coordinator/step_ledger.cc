#include "coordinator/step_ledger.h"

#include <algorithm>

#include "runtime/base/rank_layout.h"
namespace pipetrain::coordinator {

std::vector<double> StragglerRatios(const std::vector<double>& per_stage) {
  if (per_stage.empty() ||
      !std::all_of(per_stage.begin(), per_stage.end(), [](double s) { return s > 0; })) {
    return {};
  }
  std::vector<double> sorted = per_stage;
  std::sort(sorted.begin(), sorted.end());
  const size_t p = sorted.size();
  const double median = p % 2 ? sorted[p / 2] : 0.5 * (sorted[p / 2 - 1] + sorted[p / 2]);
  std::vector<double> ratios;
  for (double s : per_stage) ratios.push_back(s / median);
  return ratios;
}

StepLedger::StepLedger(int ranks, int stages, int64_t start_step, int64_t committed,
                       int64_t tokens_per_step)
    : stages_(std::max(1, stages)),
      start_step_(start_step),
      committed_(committed),
      tokens_per_step_(tokens_per_step),
      last_step_(ranks, start_step > 0 ? start_step - 1 : -1),
      compute_s_(ranks, 0),
      step_compute_s_(ranks, 0) {
  if (ranks > 0) ranks_at_step_[last_step_[0]] = ranks;
}

StepLedger::Order StepLedger::Expects(int64_t last, int64_t step) const {
  // A generation resumed by its spec starts where its checkpoint is: its first report says.
  const bool first_unknown = start_step_ < 0 && last == -1;
  if (!first_unknown && step <= last) return Order::kResent;
  if (!first_unknown && step != last + 1) return Order::kOutOfOrder;
  return Order::kNext;
}

StepLedger::Recorded StepLedger::Record(const v1::StepReport& r) {
  Recorded out;
  const int rank = r.rank();
  if (start_step_ < 0) {
    // The first report of a resumed generation fixes where every rank starts.
    start_step_ = r.step();
    for (int64_t& s : last_step_) s = std::max(s, r.step() - 1);
    ranks_at_step_.clear();
    for (int64_t s : last_step_) ++ranks_at_step_[s];
    committed_ = std::max(committed_, r.step() - 1);
  }
  auto before = ranks_at_step_.find(last_step_[rank]);
  if (--before->second == 0) ranks_at_step_.erase(before);
  ++ranks_at_step_[r.step()];
  last_step_[rank] = r.step();
  // A stage's compute per step, averaged over recent steps (an exponential moving average
  // weighing the last step 1/8, so one step slowed by the machine does not flag a
  // straggler); the first step's includes its warm-up: skipped.
  if (r.step() > 0) {
    const double step_s = r.compute_s() - compute_s_[rank];
    double& average = step_compute_s_[rank];
    average = average > 0 ? average + (step_s - average) / 8 : step_s;
  }
  compute_s_[rank] = r.compute_s();
  out.replica_first_rank = RankLayout{stages_, 1}.ReplicaFirstRank(rank);
  if (out.replica_first_rank + stages_ <= ranks()) {
    out.straggler_ratios = StragglerRatios(
        std::vector<double>(step_compute_s_.begin() + out.replica_first_rank,
                            step_compute_s_.begin() + out.replica_first_rank + stages_));
  }
  const int replica = RankLayout{stages_, 1}.ReplicaOf(rank);
  if (r.has_loss()) losses_[r.step()][replica] = r.loss();
  if (rank == 0 && r.has_grad_norm()) grad_norms_[r.step()] = r.grad_norm();
  if (r.skipped()) skipped_.insert(r.step());
  if (r.has_job_loss()) job_losses_[r.step()] = r.job_loss();
  if (r.has_eval()) evals_[r.step()][replica] = {r.eval_loss(), r.eval_accuracy()};
  if (rank == 0) {
    // Throughput from this generation's first step on (its worker's clock).
    if (first_end_s_ < 0) {
      first_end_s_ = r.end_s();
      first_report_step_ = r.step();
    } else if (r.step() > first_report_step_ && r.end_s() > first_end_s_) {
      out.tokens_per_s = static_cast<double>(tokens_per_step_) * (r.step() - first_report_step_) /
                         (r.end_s() - first_end_s_);
    }
    if (last_end_s_ >= 0) {
      step_times_s_.Add(std::max(0.0, r.end_s() - last_end_s_));
      out.step_time_s = step_times_s_.Median();
    }
    last_end_s_ = r.end_s();
  }
  const int64_t done = ranks_at_step_.begin()->first;
  for (int64_t t = committed_ + 1; t <= done; ++t) {
    out.committed.push_back(Commit(t, std::nullopt, /*loss_from_replicas_only=*/true));
  }
  committed_ = std::max(committed_, done);
  return out;
}

StepLedger::CommittedStep StepLedger::Commit(int64_t t, std::optional<double> held_loss,
                                             bool loss_from_replicas_only) {
  CommittedStep step;
  step.step = t;
  const size_t replicas = last_step_.size() / static_cast<size_t>(stages_);
  auto losses = losses_.find(t);
  auto job_loss = job_losses_.find(t);
  if (losses != losses_.end() && !losses->second.empty() &&
      (loss_from_replicas_only || losses->second.size() >= replicas)) {
    double sum = 0;
    for (const auto& [replica, loss] : losses->second) sum += loss;  // in replica order
    step.loss = sum / static_cast<double>(losses->second.size());
  } else if (!loss_from_replicas_only && job_loss != job_losses_.end()) {
    step.loss = job_loss->second;
  } else if (!loss_from_replicas_only) {
    step.loss = held_loss;
  }
  if (losses != losses_.end()) losses_.erase(losses);
  if (job_loss != job_losses_.end()) job_losses_.erase(job_loss);
  step.skipped = skipped_.erase(t) > 0;
  if (auto norm = grad_norms_.find(t); norm != grad_norms_.end()) {
    step.grad_norm = norm->second;
    grad_norms_.erase(norm);
  }
  if (auto evals = evals_.find(t); evals != evals_.end()) {
    double loss = 0, accuracy = 0;
    for (const auto& [replica, eval] : evals->second) {
      loss += eval.first;
      accuracy += eval.second;
    }
    step.eval_loss = loss / static_cast<double>(evals->second.size());
    step.eval_accuracy = accuracy / static_cast<double>(evals->second.size());
    evals_.erase(evals);
  }
  return step;
}

std::vector<StepLedger::CommittedStep> StepLedger::CommitThrough(int64_t last,
                                                                 std::optional<double> held_loss) {
  std::vector<CommittedStep> out;
  for (int64_t t = committed_ + 1; t <= last; ++t) {
    out.push_back(Commit(t, t == last ? held_loss : std::nullopt,
                         /*loss_from_replicas_only=*/false));
  }
  committed_ = std::max(committed_, last);
  return out;
}

}  // namespace pipetrain::coordinator
