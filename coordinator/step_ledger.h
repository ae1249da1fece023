// One generation's step accounting for a running job, from its ranks' step reports: the
// last step each rank finished, the steps every rank has finished (committed), each
// committed step's loss (the mean over the replicas' last stages), the job's throughput and
// median step time, and each stage's compute per step against the median stage's (straggler
// ratios).
//
// Pure: no clock, no I/O; the caller checks a report (report_checks.h) and that it is its
// rank's next step (Expects) before recording it. Thread-compatible (the coordinator holds
// its lock).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "pipetrain/v1/coordinator_service.pb.h"
#include "runtime/base/running_median.h"

namespace pipetrain::coordinator {

// Each value over the median of all, for the stages of one replica; empty while any has no
// measure yet (<= 0).
std::vector<double> StragglerRatios(const std::vector<double>& per_stage);

class StepLedger {
 public:
  StepLedger() = default;
  // `ranks` ranks, `stages` of them per replica (rank = replica * stages + stage), starting at
  // `start_step` (-1: where the first report says, a generation resumed by its spec), with
  // every step up to `committed` already committed; `tokens_per_step` (or samples) of the
  // whole job.
  StepLedger(int ranks, int stages, int64_t start_step, int64_t committed, int64_t tokens_per_step);

  int ranks() const { return static_cast<int>(last_step_.size()); }
  // The step the generation started at; -1 until its first report when not known before.
  int64_t start_step() const { return start_step_; }
  // The last step `rank` finished (-1: none).
  int64_t last_step(int rank) const { return last_step_[rank]; }
  // The last step every rank has finished.
  int64_t committed() const { return committed_; }

  // Whether a report of `step` from a rank whose last step so far is `last` is its next one
  // (kNext), one already counted and resent after a lost reply (kResent), or out of order.
  enum class Order { kNext, kResent, kOutOfOrder };
  Order Expects(int64_t last, int64_t step) const;

  struct CommittedStep {
    int64_t step = 0;
    // Mean of the replicas' losses (summed in replica order), when any reported one.
    std::optional<double> loss;
    std::optional<double> grad_norm;  // with clipping: rank 0's (every rank's is the same)
    // Its update was skipped (a non-finite loss or gradient), as a rank reported (every rank
    // skips the same steps).
    bool skipped = false;
    // With evaluation: the mean over the replicas' last stages of their held-out loss and
    // accuracy right after the step.
    std::optional<double> eval_loss, eval_accuracy;
  };
  struct Recorded {
    std::vector<CommittedStep> committed;  // steps every rank has now finished, in order
    // The straggler ratios of the reporting rank's replica, from its first rank on; empty
    // until every stage of it has a measure.
    int replica_first_rank = 0;
    std::vector<double> straggler_ratios;
    std::optional<double> tokens_per_s;  // from rank 0's reports, once two steps apart
    // The median of rank 0's step-to-step times (its end_s), from the generation's second
    // reported step on; set with each such report.
    std::optional<double> step_time_s;
  };
  // Records rank `report.rank()`'s step `report.step()` (checked by the caller: in range and
  // the rank's next step).
  Recorded Record(const v1::StepReport& report);

  // The steps up to `last` not committed yet, committed now: the survivors of a fault go on
  // from last + 1 (every place of the pipeline finished them or holds their updates; a lost
  // rank's reports will not come). Each step's loss: the replicas' mean when every replica's
  // last stage reported it (as Record), else the job loss one reported (StepReport.job_loss),
  // else `held_loss` for `last` (a last stage that held its update), else none.
  std::vector<CommittedStep> CommitThrough(int64_t last, std::optional<double> held_loss);

  // Each rank's compute seconds per step (a moving average; 0 before its second step).
  const std::vector<double>& step_compute_s() const { return step_compute_s_; }

 private:
  int stages_ = 1;
  int64_t start_step_ = 0;
  int64_t committed_ = -1;
  int64_t tokens_per_step_ = 0;
  std::vector<int64_t> last_step_;
  // How many ranks have each last step: its first key is the last step every rank finished
  // (a report costs O(log ranks), not a pass over every rank).
  std::map<int64_t, int> ranks_at_step_;
  std::vector<double> compute_s_;       // each rank's compute_s total at its last report
  std::vector<double> step_compute_s_;  // each rank's compute seconds per step (EMA)
  // Last-stage losses per step and replica, until committed: summed in replica order, so a
  // step's loss is the same to the bit whatever order the reports arrived in.
  std::map<int64_t, std::map<int, double>> losses_;
  std::map<int64_t, double> grad_norms_;  // rank 0's gradient norms, likewise
  std::set<int64_t> skipped_;             // steps a rank skipped, likewise
  std::map<int64_t, double> job_losses_;  // last stages' job losses, likewise
  // The replicas' evaluations (loss, accuracy) per step and replica, likewise.
  std::map<int64_t, std::map<int, std::pair<double, double>>> evals_;
  double first_end_s_ = -1;  // rank 0's end_s of this generation's first reported step
  int64_t first_report_step_ = 0;
  double last_end_s_ = -1;      // rank 0's end_s of its last reported step
  RunningMedian step_times_s_;  // rank 0's step-to-step times

  // Step t's record, taking what is kept of it out of the maps; `loss_from_replicas_only`:
  // Record's rule (the mean of the replicas' losses), else CommitThrough's.
  CommittedStep Commit(int64_t t, std::optional<double> held_loss, bool loss_from_replicas_only);
};

}  // namespace pipetrain::coordinator
