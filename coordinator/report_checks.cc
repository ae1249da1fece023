#include "coordinator/report_checks.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

bool WithoutControlCharacters(const std::string& text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<unsigned char>(c) >= 0x20; });
}

absl::Status CheckStepReportFields(const v1::StepReport& r, int stages, const std::string& where) {
  for (double v : {r.compute_s(), r.wait_s(), r.end_s()}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " step ", r.step(), ": times must be finite and >= 0, got ", v));
    }
  }
  if (r.peak_memory_bytes() < 0 || r.parameter_bytes() < 0 || r.peak_tensor_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": negative byte counts"));
  }
  if (r.layers_begin() < 0 || r.layers_end() < r.layers_begin()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": layers [", r.layers_begin(), ", ",
                                                   r.layers_end(), ") are not a range"));
  }
  const std::string& committed = r.checkpoint_committed();
  if (!committed.empty() && (r.rank() >= stages || committed.size() > 4096 ||
                             committed.front() != '/' || !WithoutControlCharacters(committed))) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": a committed checkpoint is reported by a rank of replica 0 as an absolute "
                     "path of at most 4096 bytes without control characters"));
  }
  bool passed_over_ok = r.passed_over_size() <= 16;
  for (const std::string& why : r.passed_over()) {
    passed_over_ok = passed_over_ok && why.size() <= 1024 && WithoutControlCharacters(why);
  }
  if ((!r.resumed_from().empty() || r.passed_over_size() > 0) &&
      (r.rank() != 0 || r.resumed_from().size() > 4096 ||
       !WithoutControlCharacters(r.resumed_from()) || !passed_over_ok)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": where a job resumed from is reported by rank 0: a path of at most 4096 "
                     "bytes and at most 16 checkpoints passed over, 1 KiB each, without control "
                     "characters"));
  }
  if (r.state_from_replicas().size() > 1024 || !WithoutControlCharacters(r.state_from_replicas())) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": how a rank's state came from the survivors is at most 1 KiB without control "
        "characters"));
  }
  const v1::StageBreakdown& b = r.breakdown();
  for (double v : {b.forward_s(), b.backward_s(), b.optimizer_s(), b.receive_forward_s(),
                   b.receive_backward_s(), b.send_forward_s(), b.send_backward_s(),
                   b.exposed_allreduce_s(), b.last_step_s(), b.last_step_bubble_ratio()}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " step ", r.step(), ": breakdown times must be finite and >= 0, got ", v));
    }
  }
  if (b.last_step_bubble_ratio() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, " step ", r.step(),
                                                   ": a bubble ratio is at most 1, got ",
                                                   b.last_step_bubble_ratio()));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::coordinator
