// See restart_point.h.
#include "coordinator/restart_point.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

void RestartPoint::Reported(int64_t step, std::string dir, int64_t restart_point) {
  if (step <= restart_point || dir.empty()) return;
  pending_ = {step, std::move(dir)};
}

RestartPoint::Decision RestartPoint::Committed(int64_t committed_through, int64_t restart_point,
                                               int64_t job_steps) {
  Decision decision;
  if (pending_.step <= restart_point) return decision;
  if (pending_.step >= job_steps) {
    decision.final_one = std::move(pending_);
    pending_ = {};
    return decision;
  }
  if (committed_through < pending_.step - 1) return decision;
  decision.restart_point = pending_;
  if (drain_step_ > 0 && pending_.step >= drain_step_) {
    decision.drained =
        absl::StrCat(draining_worker_, " (", draining_address_,
                     ") was stopped (drained) after the checkpoint before step ", drain_step_);
  }
  return decision;
}

void RestartPoint::Drain(std::string worker_id, std::string address, int64_t step) {
  if (drain_step_ > 0 || step <= 0) return;
  draining_worker_ = std::move(worker_id);
  draining_address_ = std::move(address);
  drain_step_ = step;
}

}  // namespace pipetrain::coordinator
