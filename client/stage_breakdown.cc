#include "client/stage_breakdown.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/byte_size.h"
#include "runtime/base/printable.h"

namespace pipetrain::client {
namespace {

// The columns of the breakdown: name and total seconds.
std::vector<std::pair<const char*, double>> Totals(const v1::StageBreakdown& b) {
  return {{"forward", b.forward_s()},
          {"backward", b.backward_s()},
          {"optimizer", b.optimizer_s()},
          {"recv_act", b.receive_forward_s()},
          {"recv_grad", b.receive_backward_s()},
          {"send", b.send_forward_s() + b.send_backward_s()},
          {"allreduce", b.exposed_allreduce_s()}};
}

int64_t StepsDone(const v1::StageStatus& s) { return s.step() + 1; }

}  // namespace

std::string GradNormText(const v1::Job& job) {
  return job.has_grad_norm() ? absl::StrFormat("  grad norm %.4g", job.grad_norm()) : "";
}

std::string EvalText(const v1::Job& job) {
  return job.eval_step() > 0
             ? absl::StrFormat("held-out loss %.4f accuracy %.4f (before step %d)", job.eval_loss(),
                               job.eval_accuracy(), job.eval_step())
             : "";
}

std::string StageBreakdownTable(const v1::Job& job) {
  std::string out = absl::StrFormat("job %s: step %d/%d  loss %.4f  lr %.4g%s  %.0f %s/s\n",
                                    Printable(job.id()), job.step() + 1, job.steps(), job.loss(),
                                    job.learning_rate(), GradNormText(job), job.tokens_per_s(),
                                    job.data_unit().empty() ? "tok" : Printable(job.data_unit()));
  if (job.eval_step() > 0) out += EvalText(job) + "\n";
  // Above the seven breakdown columns, and above the last step's two.
  out += absl::StrFormat("%37s%-70s%s\n", "", "ms per step, mean over the steps done", "last step");
  out += absl::StrFormat("%-5s %-7s %-12s %-9s", "stage", "replica", "worker", "steps");
  for (const auto& [name, total] : Totals(v1::StageBreakdown())) {
    out += absl::StrFormat(" %9s", name);
  }
  out += absl::StrFormat(" %9s %7s %10s %10s\n", "step_ms", "bubble", "straggler", "peak_mem");
  bool any = false;
  for (const v1::StageStatus& s : job.stage_status()) {
    const int64_t steps = StepsDone(s);
    if (steps <= 0) continue;
    any = true;
    out += absl::StrFormat("%-5d %-7d %-12s %-9d", s.stage(), s.replica(), Printable(s.worker_id()),
                           steps);
    for (const auto& [name, total] : Totals(s.breakdown())) {
      out += absl::StrFormat(" %9.2f", 1e3 * total / static_cast<double>(steps));
    }
    const v1::StageBreakdown& b = s.breakdown();
    out += b.last_step_s() > 0
               ? absl::StrFormat(" %9.2f %7.2f", 1e3 * b.last_step_s(), b.last_step_bubble_ratio())
               : absl::StrFormat(" %9s %7s", "-", "-");
    out += s.straggler_ratio() > 0 ? absl::StrFormat(" %10.2f", s.straggler_ratio())
                                   : absl::StrFormat(" %10s", "-");
    out += absl::StrFormat(" %10s", MebiBytes(s.peak_memory_bytes()));
    if (s.straggler_ratio() > kStragglerRatio) out += "  <- straggler";
    out += "\n";
  }
  if (!any) out += "(no step reported yet)\n";
  return out;
}

nlohmann::json StageBreakdownJson(const v1::Job& job) {
  nlohmann::json stages = nlohmann::json::array();
  for (const v1::StageStatus& s : job.stage_status()) {
    const int64_t steps = StepsDone(s);
    nlohmann::json per_step = nlohmann::json::object();
    for (const auto& [name, total] : Totals(s.breakdown())) {
      per_step[name] = steps > 0 ? 1e3 * total / static_cast<double>(steps) : 0.0;
    }
    stages.push_back({{"stage", s.stage()},
                      {"replica", s.replica()},
                      {"worker", s.worker_id()},
                      {"steps", steps},
                      {"ms_per_step", per_step},
                      {"last_step_s", s.breakdown().last_step_s()},
                      {"last_step_bubble_ratio", s.breakdown().last_step_bubble_ratio()},
                      {"straggler_ratio", s.straggler_ratio()},
                      {"peak_memory_bytes", s.peak_memory_bytes()}});
  }
  return {{"job_id", job.id()},
          {"step", job.step()},
          {"loss", job.loss()},
          {"learning_rate", job.learning_rate()},
          {"grad_norm", job.has_grad_norm() ? nlohmann::json(job.grad_norm()) : nullptr},
          {"eval", job.eval_step() > 0 ? nlohmann::json({{"step", job.eval_step()},
                                                         {"loss", job.eval_loss()},
                                                         {"accuracy", job.eval_accuracy()}})
                                       : nlohmann::json(nullptr)},
          {"stages", stages}};
}

}  // namespace pipetrain::client
