#include "runtime/job/report/report.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/base/clock.h"
#include "runtime/base/status_macros.h"
#include "runtime/model/model_zoo.h"
#include "runtime/schedule/simulator.h"
#include "runtime/weights/optimizer_config.h"

namespace pipetrain::job {
namespace {

using schedule::ActionKind;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Steady-state step time of the job's schedule, simulated (schedule::Simulate) over the
// lists its ranks ran, with every action costing the mean measured time (its waits left
// out) of that kind of action on that model stage of that rank of replica 0: what the run
// would take if no rank ever waited for another's compute beyond what the schedule makes it.
absl::StatusOr<double> IdealStepTime(const JobSpec& c, const JobPlan& plan,
                                     const std::vector<executor::StageStats>& stats) {
  const int p = plan.ranks();  // replica 0's ranks come first in `stats`
  // (rank, model stage, kind) -> (total, count).
  using Key = std::tuple<int, int, ActionKind>;
  const auto key = [](int rank, const schedule::Action& a) {
    return Key{rank, a.stage == schedule::kOwnStage ? rank : a.stage, a.kind};
  };
  std::map<Key, std::pair<double, int>> sums;
  for (int r = 0; r < p; ++r) {
    for (const auto& record : stats[r].records) {
      auto& [total, count] = sums[key(r, record.action)];
      total += record.end_s - record.start_s - record.wait_s;
      ++count;
    }
  }
  schedule::CostModel cost;
  cost.duration = [&](int rank, const schedule::Action& a) {
    auto it = sums.find(key(rank, a));
    if (it == sums.end() || it->second.second == 0) return 0.0;
    return it->second.first / it->second.second;
  };
  PT_ASSIGN_OR_RETURN(auto lists, schedule::BuildSchedule(ScheduleParamsOf(c, /*steps=*/3)));
  PT_ASSIGN_OR_RETURN(schedule::SimulationResult sim, schedule::Simulate(lists, cost));
  return sim.step_end_s[0][2] - sim.step_end_s[0][1];
}

// Per step t: exposed = max over all stages of all replicas of (end of its last AllReduce
// of t) - (the latest end of stage 0's last backward of t over the replicas), at least 0;
// total = max over stages of the time from its first AllReduce start to its last AllReduce
// end in t. Measuring from the latest replica keeps waiting for a straggling replica (load
// imbalance, which overlap cannot hide) out of the exposed communication.
void ExposedAllReduce(const std::vector<executor::StageStats>& stats, int p,
                      std::vector<double>* exposed, std::vector<double>* total) {
  std::map<int64_t, double> last_backward_end;
  for (size_t first = 0; first < stats.size(); first += p) {
    for (const auto& step : stats[first].steps) {
      double& end = last_backward_end[step.step];
      end = std::max(end, step.last_backward_end_s);
    }
  }
  std::map<int64_t, double> worst_end, worst_total;
  for (const auto& st : stats) {
    // A stage's AllReduce time in a step: from its first bucket's start to its last
    // bucket's end (buckets run concurrently, so their durations do not add up).
    std::map<int64_t, double> start, end;
    for (const auto& a : st.allreduces) {
      start[a.step] = start.count(a.step) ? std::min(start[a.step], a.start_s) : a.start_s;
      end[a.step] = std::max(end[a.step], a.end_s);
    }
    for (const auto& [t, e] : end) {
      worst_end[t] = std::max(worst_end[t], e);
      worst_total[t] = std::max(worst_total[t], e - start[t]);
    }
  }
  for (const auto& [t, e] : worst_end) {
    if (t == 0 || !last_backward_end.count(t)) continue;  // step 0 includes warm-up
    exposed->push_back(std::max(0.0, e - last_backward_end[t]));
    total->push_back(worst_total[t]);
  }
}

}  // namespace

std::vector<at::Tensor> DetachedCopies(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.detach().clone());
  return out;
}

absl::Status StoppedStagesError(const std::vector<absl::Status>& results,
                                const std::vector<std::optional<schedule::Action>>& stopped_at) {
  // The root cause is the first error that is not another stage's abort.
  const absl::Status* root = nullptr;
  for (const absl::Status& st : results) {
    if (!st.ok() && (root == nullptr || (absl::IsAborted(*root) && !absl::IsAborted(st)))) {
      root = &st;
    }
  }
  if (root == nullptr) return absl::OkStatus();
  std::vector<std::string> positions;
  for (size_t s = 0; s < stopped_at.size(); ++s) {
    positions.push_back(absl::StrCat(
        "stage ", s, " ", stopped_at[s] ? schedule::ToString(*stopped_at[s]) : "finished"));
  }
  return absl::Status(
      root->code(),
      absl::StrCat(root->message(), " [stopped at: ", absl::StrJoin(positions, ", "), "]"));
}

void CopyNewestWeights(const StageParts& parts, StageOutcome& outcome) {
  outcome.parameters.clear();
  outcome.buffers.clear();
  outcome.parameter_counts.clear();
  outcome.buffer_counts.clear();
  outcome.model_stages = parts.model_stages;
  for (const auto& store : parts.weights) {
    const std::vector<at::Tensor> params = DetachedCopies(store->Newest().Parameters());
    const std::vector<at::Tensor> buffers = DetachedCopies(store->Newest().Buffers());
    outcome.parameters.insert(outcome.parameters.end(), params.begin(), params.end());
    outcome.buffers.insert(outcome.buffers.end(), buffers.begin(), buffers.end());
    outcome.parameter_counts.push_back(static_cast<int>(params.size()));
    outcome.buffer_counts.push_back(static_cast<int>(buffers.size()));
  }
}

ProgressTracker::ProgressTracker(const JobSpec& c, const JobPlan& plan, double start_s,
                                 std::function<void(const Progress&)> sink, int64_t first_step)
    : steps_(c.steps()),
      start_s_(start_s),
      rows_per_step_(int64_t{c.replicas()} * c.microbatches() * c.microbatch_size()),
      tokens_per_row_(plan.dataset->is_token_data() ? c.data().seq_len() : 1),
      replicas_(c.replicas()),
      sink_(std::move(sink)),
      first_step_(first_step),
      next_(first_step) {}

void ProgressTracker::StepEnded(int64_t step, double end_s, std::optional<double> grad_norm) {
  std::lock_guard<std::mutex> lock(mu_);
  ends_[step] = end_s;
  if (grad_norm) grad_norms_[step] = *grad_norm;
  Flush();
}

void ProgressTracker::LossKnown(int64_t step, double loss) {
  std::lock_guard<std::mutex> lock(mu_);
  losses_[step] += loss / replicas_;
  ++loss_count_[step];
  Flush();
}

void ProgressTracker::Flush() {
  while (ends_.count(next_) && loss_count_[next_] == replicas_) {
    Progress p;
    p.step = next_;
    p.steps = steps_;
    p.loss = losses_[next_];
    const double end_s = ends_[next_];
    if (next_ == first_step_) first_end_s_ = end_s;
    p.elapsed_s = end_s - start_s_;
    if (next_ > first_step_) {
      const double dt = end_s - first_end_s_;
      p.samples_per_s = dt > 0 ? rows_per_step_ * (next_ - first_step_) / dt : 0;
    } else {
      p.samples_per_s = p.elapsed_s > 0 ? rows_per_step_ / p.elapsed_s : 0;
    }
    p.tokens_per_s = p.samples_per_s * tokens_per_row_;
    emitted_losses_.push_back(p.loss);
    if (auto norm = grad_norms_.find(next_); norm != grad_norms_.end()) {
      p.grad_norm = norm->second;
      emitted_grad_norms_.push_back(norm->second);
      grad_norms_.erase(norm);
    }
    ends_.erase(next_);
    losses_.erase(next_);
    loss_count_.erase(next_);
    if (sink_) sink_(p);
    ++next_;
  }
}

std::vector<double> ProgressTracker::Losses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return emitted_losses_;
}

void ProgressTracker::EvalKnown(int64_t step, const executor::EvalRecord& eval) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& [count, sum] = evals_[step];
  ++count;
  sum.step = step + 1;
  sum.loss += eval.loss / replicas_;
  sum.accuracy += eval.accuracy / replicas_;
}

std::vector<EvalPoint> ProgressTracker::Evals() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<EvalPoint> out;
  for (const auto& [step, counted] : evals_) {
    if (counted.first == replicas_) out.push_back(counted.second);
  }
  return out;
}

std::vector<double> ProgressTracker::GradNorms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return emitted_grad_norms_;
}

absl::Status WeightsInModelOrder(absl::Span<StageOutcome> ranks,
                                 std::vector<at::Tensor>& parameters,
                                 std::vector<at::Tensor>& buffers) {
  size_t model_stages = 0;
  for (const StageOutcome& out : ranks) model_stages += out.model_stages.size();
  std::vector<std::vector<at::Tensor>> stage_parameters(model_stages);
  std::vector<std::vector<at::Tensor>> stage_buffers(model_stages);
  std::vector<bool> held(model_stages, false);
  for (size_t r = 0; r < ranks.size(); ++r) {
    StageOutcome& out = ranks[r];
    size_t next_parameter = 0, next_buffer = 0;
    for (size_t k = 0; k < out.model_stages.size(); ++k) {
      const int stage = out.model_stages[k];
      if (stage < 0 || static_cast<size_t>(stage) >= model_stages || held[stage] ||
          k >= out.parameter_counts.size() || k >= out.buffer_counts.size() ||
          next_parameter + out.parameter_counts[k] > out.parameters.size() ||
          next_buffer + out.buffer_counts[k] > out.buffers.size()) {
        return absl::InternalError(absl::StrCat("rank ", r, "'s weights do not match its stages"));
      }
      held[stage] = true;
      for (int i = 0; i < out.parameter_counts[k]; ++i) {
        stage_parameters[stage].push_back(std::move(out.parameters[next_parameter++]));
      }
      for (int i = 0; i < out.buffer_counts[k]; ++i) {
        stage_buffers[stage].push_back(std::move(out.buffers[next_buffer++]));
      }
    }
  }
  for (size_t stage = 0; stage < model_stages; ++stage) {
    for (auto& t : stage_parameters[stage]) parameters.push_back(std::move(t));
    for (auto& t : stage_buffers[stage]) buffers.push_back(std::move(t));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobReport> AssembleReport(const JobSpec& c, const JobPlan& plan,
                                         std::vector<StageOutcome> stages,
                                         std::vector<double> losses, std::vector<double> grad_norms,
                                         std::vector<EvalPoint> evals, int64_t first_step,
                                         double start_s) {
  const int p = plan.ranks();
  if (static_cast<int>(stages.size()) != p * c.replicas()) {
    return absl::InternalError("AssembleReport needs one outcome per replica and rank");
  }
  JobReport report;
  report.schedule = std::string(schedule::ScheduleKindName(ScheduleOf(c)));
  report.stages = p;
  report.replicas = c.replicas();
  report.micro_batches = c.microbatches();
  report.micro_batch_size = c.microbatch_size();
  report.steps = c.steps();
  report.partition = plan.partition;
  report.data_entropy = plan.dataset->entropy_nats();
  report.data_summary = plan.dataset->Describe();
  report.model_summary = absl::StrCat(c.model().name(), ": ", plan.layers.size(), " layers, ",
                                      plan.num_parameters(), " parameters");
  report.threads_per_stage = ThreadsPerStage(c, p);
  report.wall_s = MonotonicSeconds() - start_s;
  report.losses = std::move(losses);
  if (report.losses.empty()) return absl::InternalError("the job finished no step");
  report.first_step = first_step;
  report.grad_norms = std::move(grad_norms);
  report.evals = std::move(evals);
  for (size_t k = 0; k < report.losses.size(); ++k) {
    report.learning_rates.push_back(weights::LearningRateAt(
        OptimizerConfigOf(c), first_step + static_cast<int64_t>(k), c.steps()));
  }
  // Replica 0 speaks for the rest in the per-stage summary and the parameters (the replicas
  // hold identical ones); every replica's measurements are kept.
  for (int s = 0; s < p; ++s) {
    const StageOutcome& out = stages[s];
    report.per_stage.push_back({s, RankLayers(plan, s), out.stats.peak_stashed_microbatches,
                                out.stats.peak_weight_versions, out.stats.compute_s,
                                out.stats.wait_s, out.stats.allreduce_s, out.parameter_bytes,
                                out.peak_memory_bytes, out.peak_tensor_bytes, out.bytes_sent});
  }
  PT_RETURN_IF_ERROR(WeightsInModelOrder(absl::MakeSpan(stages.data(), p), report.final_parameters,
                                         report.final_buffers));
  for (StageOutcome& out : stages) report.stage_stats.push_back(std::move(out.stats));
  const int64_t rows_per_step = int64_t{c.replicas()} * c.microbatches() * c.microbatch_size();
  const int64_t tokens_per_row = plan.dataset->is_token_data() ? c.data().seq_len() : 1;
  const auto& steps0 = report.stage_stats[0].steps;
  if (steps0.empty()) return absl::InternalError("stage 0 finished no step");
  std::vector<double> step_times;
  for (size_t i = 1; i < steps0.size(); ++i) {
    step_times.push_back(steps0[i].end_s - steps0[i - 1].end_s);
  }
  report.step_time_s = step_times.empty() ? steps0.back().end_s - start_s : Median(step_times);
  if (steps0.size() > 1) {
    const double dt = steps0.back().end_s - steps0.front().end_s;
    report.samples_per_s = rows_per_step * (steps0.size() - 1) / dt;
  } else {
    report.samples_per_s = rows_per_step / (steps0.back().end_s - start_s);
  }
  report.tokens_per_s = report.samples_per_s * tokens_per_row;
  report.token_data = plan.dataset->is_token_data();
  PT_ASSIGN_OR_RETURN(report.ideal_step_time_s, IdealStepTime(c, plan, report.stage_stats));
  if (c.replicas() > 1) {
    std::vector<double> exposed, total;
    ExposedAllReduce(report.stage_stats, p, &exposed, &total);
    report.exposed_allreduce_s = Median(exposed);
    report.allreduce_s = Median(total);
  }
  return report;
}

}  // namespace pipetrain::job
