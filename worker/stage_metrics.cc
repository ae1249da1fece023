#include "worker/stage_metrics.h"

#include <utility>

#include "absl/time/clock.h"

namespace pipetrain::worker {
namespace {

using schedule::ActionKind;
const std::vector<std::string> kRankLabels = {"job_id", "pp_stage", "dp_replica", "worker"};

std::vector<std::string> With(std::vector<std::string> names, const std::string& extra) {
  names.push_back(extra);
  return names;
}

}  // namespace

StageMetrics::StageMetrics(metrics::Registry* registry, const StageMetricsLabels& labels,
                           int64_t samples_per_step, int64_t tokens_per_sample, bool last_stage,
                           std::shared_ptr<const job::StageHandle> handle)
    : registry_(registry),
      labels_(labels),
      samples_per_step_(samples_per_step),
      tokens_per_sample_(tokens_per_sample),
      last_stage_(last_stage),
      handle_(std::move(handle)) {
  const metrics::LabelValues rank = {labels.job_id, std::to_string(labels.stage),
                                     std::to_string(labels.replica), labels.worker};
  auto with = [&rank](const std::string& v) {
    metrics::LabelValues out = rank;
    out.push_back(v);
    return out;
  };
  metrics::Registry& r = *registry;
  steps_ = &r.GetCounter("pipetrain_stage_steps_total", "Steps this rank has completed.",
                         kRankLabels, rank);
  samples_ = &r.GetCounter("pipetrain_stage_samples_total",
                           "Samples (rows) this rank has processed.", kRankLabels, rank);
  if (tokens_per_sample > 0) {
    tokens_ = &r.GetCounter("pipetrain_stage_tokens_total", "Tokens this rank has processed.",
                            kRankLabels, rank);
  }
  const auto phase = With(kRankLabels, "phase");
  const char* compute_help =
      "Seconds this rank computed: forward, backward (with recomputation and any AllReduce "
      "inside it), optimizer (the update, with any AllReduce before it).";
  compute_forward_ =
      &r.GetCounter("pipetrain_stage_compute_seconds_total", compute_help, phase, with("forward"));
  compute_backward_ =
      &r.GetCounter("pipetrain_stage_compute_seconds_total", compute_help, phase, with("backward"));
  compute_optimizer_ = &r.GetCounter("pipetrain_stage_compute_seconds_total", compute_help, phase,
                                     with("optimizer"));
  const char* receive_help =
      "Seconds this rank waited to receive: activations (forward), gradients (backward).";
  receive_forward_ = &r.GetCounter("pipetrain_stage_receive_wait_seconds_total", receive_help,
                                   phase, with("forward"));
  receive_backward_ = &r.GetCounter("pipetrain_stage_receive_wait_seconds_total", receive_help,
                                    phase, with("backward"));
  const char* send_help =
      "Seconds this rank spent handing messages to the transport: activations (forward), "
      "gradients (backward).";
  send_forward_ =
      &r.GetCounter("pipetrain_stage_send_wait_seconds_total", send_help, phase, with("forward"));
  send_backward_ =
      &r.GetCounter("pipetrain_stage_send_wait_seconds_total", send_help, phase, with("backward"));
  exposed_allreduce_ =
      &r.GetCounter("pipetrain_stage_exposed_allreduce_seconds_total",
                    "Seconds of gradient AllReduce among replicas not hidden behind backward.",
                    kRankLabels, rank);
  const auto kind = With(kRankLabels, "kind");
  sent_activation_ = &r.GetCounter("pipetrain_stage_sent_bytes_total",
                                   "Tensor bytes this rank sent to its pipeline neighbours.", kind,
                                   with("activation"));
  sent_gradient_ = &r.GetCounter("pipetrain_stage_sent_bytes_total",
                                 "Tensor bytes this rank sent to its pipeline neighbours.", kind,
                                 with("gradient"));
  received_activation_ = &r.GetCounter(
      "pipetrain_stage_received_bytes_total",
      "Tensor bytes this rank received from its pipeline neighbours.", kind, with("activation"));
  received_gradient_ = &r.GetCounter(
      "pipetrain_stage_received_bytes_total",
      "Tensor bytes this rank received from its pipeline neighbours.", kind, with("gradient"));
  step_duration_ = &r.GetHistogram("pipetrain_stage_step_duration_seconds",
                                   "Time between this rank's consecutive weight updates.",
                                   kRankLabels, rank, metrics::SecondsBuckets());
  bubble_ = &r.GetGauge("pipetrain_stage_bubble_ratio",
                        "Share of this rank's last step not spent computing (waits for peers).",
                        kRankLabels, rank);
  last_step_time_ = &r.GetGauge("pipetrain_stage_last_step_timestamp_seconds",
                                "Unix time this rank finished its last step (for stall alerts).",
                                kRankLabels, rank);
  if (last_stage) {
    loss_ =
        &r.GetGauge("pipetrain_stage_loss",
                    "Mean loss of this replica's last step (last stage only).", kRankLabels, rank);
  }
  // What the stage is doing now, read at scrape time (nothing while no executor runs).
  using Samples = std::vector<metrics::CollectedSample>;
  collectors_.push_back(r.AddCollector(
      "pipetrain_stage_action_info",
      "1 for the action this rank runs now and what it waits for (\"\" while computing).",
      With(With(kRankLabels, "action"), "waiting_for"), [this, rank] {
        const std::optional<executor::StageActivity> a = handle_->Activity();
        if (!a) return Samples{};
        metrics::LabelValues labels = rank;
        labels.push_back(a->action);
        labels.push_back(a->waiting_for);
        return Samples{{labels, 1}};
      }));
  collectors_.push_back(
      r.AddCollector("pipetrain_stage_stashed_microbatches",
                     "Micro-batches whose forward is done and backward is not, on this rank now.",
                     kRankLabels, [this, rank] {
                       const std::optional<executor::StageActivity> a = handle_->Activity();
                       return a ? Samples{{rank, double(a->stashed_microbatches)}} : Samples{};
                     }));
  collectors_.push_back(r.AddCollector(
      "pipetrain_stage_live_weight_versions",
      "Weight versions this rank holds now (used by stashed micro-batches, plus the newest, "
      "plus those vertical sync keeps for micro-batches to come).",
      kRankLabels, [this, rank] {
        const std::optional<executor::StageActivity> a = handle_->Activity();
        return a ? Samples{{rank, double(a->live_weight_versions)}} : Samples{};
      }));
}

StageMetrics::~StageMetrics() {
  for (int id : collectors_) registry_->RemoveCollector(id);
}

void StageMetrics::ForgetJob(metrics::Registry* registry, const std::string& job_id) {
  registry->RemoveSeriesWith("job_id", job_id);
}

void StageMetrics::OnAction(const executor::ActionRecord& r) {
  const double busy = r.end_s - r.start_s - r.wait_s;
  const double whole = r.end_s - r.start_s;
  const double bytes = static_cast<double>(r.bytes);
  switch (r.action.kind) {
    case ActionKind::kForward:
      compute_forward_->Increment(busy);
      times_.forward_s += busy;
      break;
    case ActionKind::kBackward:
    case ActionKind::kInputGradient:
    case ActionKind::kWeightGradient:
      compute_backward_->Increment(busy);
      times_.backward_s += busy;
      break;
    case ActionKind::kOptimizerStep:
      compute_optimizer_->Increment(busy);
      times_.optimizer_s += busy;
      break;
    case ActionKind::kRecvActivation:
      receive_forward_->Increment(whole);
      times_.receive_forward_s += whole;
      received_activation_->Increment(bytes);
      break;
    case ActionKind::kRecvGradient:
      receive_backward_->Increment(whole);
      times_.receive_backward_s += whole;
      received_gradient_->Increment(bytes);
      break;
    case ActionKind::kSendActivation:
      send_forward_->Increment(whole);
      times_.send_forward_s += whole;
      sent_activation_->Increment(bytes);
      break;
    case ActionKind::kSendGradient:
      send_backward_->Increment(whole);
      times_.send_backward_s += whole;
      sent_gradient_->Increment(bytes);
      break;
  }
}

void StageMetrics::OnStep(const executor::StepRecord& step) {
  steps_->Increment();
  samples_->Increment(static_cast<double>(samples_per_step_));
  if (tokens_ != nullptr) {
    tokens_->Increment(static_cast<double>(samples_per_step_ * tokens_per_sample_));
  }
  exposed_allreduce_->Increment(step.allreduce_s);
  times_.exposed_allreduce_s += step.allreduce_s;
  if (previous_end_s_ >= 0) {
    const double duration = step.end_s - previous_end_s_;
    step_duration_->Observe(duration);
    if (duration > 0) {
      const double computing = step.compute_s - previous_compute_s_;
      times_.last_step_s = duration;
      times_.last_step_bubble_ratio = std::clamp(1.0 - computing / duration, 0.0, 1.0);
      bubble_->Set(times_.last_step_bubble_ratio);
    }
  }
  previous_end_s_ = step.end_s;
  previous_compute_s_ = step.compute_s;
  last_step_time_->Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  if (loss_ != nullptr && step.mean_loss) loss_->Set(*step.mean_loss);
  if (step.grad_norm) {
    if (grad_norm_ == nullptr) {
      grad_norm_ = &registry_->GetGauge(
          "pipetrain_stage_grad_norm",
          "The 2-norm of the whole model's gradient of this rank's last step, before clipping "
          "(jobs that clip their gradients; the same on every rank).",
          kRankLabels,
          {labels_.job_id, std::to_string(labels_.stage), std::to_string(labels_.replica),
           labels_.worker});
    }
    grad_norm_->Set(*step.grad_norm);
  }
}

v1::StageBreakdown ToBreakdown(const StageTimes& times) {
  v1::StageBreakdown b;
  b.set_forward_s(times.forward_s);
  b.set_backward_s(times.backward_s);
  b.set_optimizer_s(times.optimizer_s);
  b.set_receive_forward_s(times.receive_forward_s);
  b.set_receive_backward_s(times.receive_backward_s);
  b.set_send_forward_s(times.send_forward_s);
  b.set_send_backward_s(times.send_backward_s);
  b.set_exposed_allreduce_s(times.exposed_allreduce_s);
  b.set_last_step_bubble_ratio(times.last_step_bubble_ratio);
  b.set_last_step_s(times.last_step_s);
  return b;
}

}  // namespace pipetrain::worker
