#include "jobspec/job_config_from_spec.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "runtime/base/errors.h"
#include "runtime/model/parameter_kind.h"
#include "runtime/schedule/schedule.h"

namespace pipetrain::jobspec {
namespace {

template <typename From, typename To>
void Copy(bool present, const From& from, To* to) {
  if (present) *to = static_cast<To>(from);
}

}  // namespace

absl::StatusOr<job::JobConfig> JobConfigFromSpec(const v1::JobSpec& s) {
  job::JobConfig c;
  std::vector<std::string> errors;
  c.name = s.name();
  const v1::ModelSpec& m = s.model();
  Copy(m.has_name(), m.name(), &c.model.name);
  Copy(m.has_d_model(), m.d_model(), &c.model.d_model);
  Copy(m.has_n_heads(), m.n_heads(), &c.model.n_heads);
  Copy(m.has_n_layers(), m.n_layers(), &c.model.n_layers);
  Copy(m.has_dropout(), m.dropout(), &c.model.dropout);
  Copy(m.has_hidden(), m.hidden(), &c.model.hidden);
  Copy(m.has_hidden_layers(), m.hidden_layers(), &c.model.hidden_layers);
  Copy(m.has_input_dim(), m.input_dim(), &c.model.input_dim);
  if (m.image_shape_size() > 0) c.model.image_shape.assign(m.image_shape().begin(), m.image_shape().end());
  Copy(m.has_num_classes(), m.num_classes(), &c.model.num_classes);
  Copy(m.has_path(), m.path(), &c.model.torchscript_path);
  Copy(m.has_tie_embeddings(), m.tie_embeddings(), &c.model.tie_embeddings);
  c.model.tie.assign(m.tie().begin(), m.tie().end());

  const v1::DataSpec& d = s.data();
  Copy(d.has_kind(), d.kind(), &c.data.kind);
  Copy(d.has_path(), d.path(), &c.data.path);
  Copy(d.has_seq_len(), d.seq_len(), &c.data.seq_len);
  Copy(d.has_vocab(), d.vocab(), &c.data.vocab);
  Copy(d.has_branching(), d.branching(), &c.data.branching);
  Copy(d.has_num_tokens(), d.num_tokens(), &c.data.num_tokens);
  Copy(d.has_num_samples(), d.num_samples(), &c.data.num_samples);
  Copy(d.has_seed(), d.seed(), &c.data.seed);

  const v1::EvalSpec& e = s.eval();
  Copy(e.has_every(), e.every(), &c.eval.every);
  Copy(e.has_batches(), e.batches(), &c.eval.batches);
  Copy(e.has_split(), e.split(), &c.eval.split);

  const v1::OptimizerSpec& o = s.optimizer();
  Copy(o.has_name(), o.name(), &c.optimizer.name);
  Copy(o.has_lr(), o.lr(), &c.optimizer.lr);
  Copy(o.has_weight_decay(), o.weight_decay(), &c.optimizer.weight_decay);
  Copy(o.has_momentum(), o.momentum(), &c.optimizer.momentum);
  Copy(o.has_beta1(), o.beta1(), &c.optimizer.beta1);
  Copy(o.has_beta2(), o.beta2(), &c.optimizer.beta2);
  Copy(o.has_eps(), o.eps(), &c.optimizer.eps);
  Copy(o.has_clip_grad_norm(), o.clip_grad_norm(), &c.optimizer.clip_grad_norm);
  for (const std::string& name : o.no_decay()) {
    absl::StatusOr<model::ParameterKind> kind = model::ParseParameterKind(name);
    if (kind.ok()) {
      c.optimizer.no_decay |= model::KindBit(*kind);
    } else {
      errors.push_back(absl::StrCat("optimizer.no_decay: ", kind.status().message()));
    }
  }
  const v1::LrScheduleSpec& lr = o.schedule();
  Copy(lr.has_warmup_steps(), lr.warmup_steps(), &c.optimizer.schedule.warmup_steps);
  if (lr.has_decay()) {
    absl::StatusOr<weights::LrDecay> decay = weights::ParseLrDecay(lr.decay());
    if (decay.ok()) {
      c.optimizer.schedule.decay = *decay;
    } else {
      errors.push_back(absl::StrCat("optimizer.schedule.decay: ", decay.status().message()));
    }
  }
  Copy(lr.has_decay_steps(), lr.decay_steps(), &c.optimizer.schedule.decay_steps);
  Copy(lr.has_min_lr(), lr.min_lr(), &c.optimizer.schedule.min_lr);

  if (s.has_schedule()) {
    auto kind = schedule::ParseScheduleKind(s.schedule());
    if (kind.ok()) {
      c.schedule = *kind;
    } else {
      // One violation: its list of names must not read as more ("; " separates them).
      errors.push_back(absl::StrCat(
          "schedule: ", absl::StrReplaceAll(kind.status().message(), {{"; ", ", "}})));
    }
  }
  // Explicit ranges fix the depth unless `stages` says otherwise (ValidateJobConfig then
  // reports the mismatch).
  for (const v1::LayerRange& r : s.stage_ranges()) c.stage_ranges.push_back({r.begin(), r.end()});
  Copy(s.has_virtual_stages(), s.virtual_stages(), &c.virtual_stages);
  Copy(s.has_vertical_sync(), s.vertical_sync(), &c.vertical_sync);
  c.stages = s.has_stages() ? s.stages() : job::PipelineStages(c);
  c.auto_stages = s.auto_stages();
  Copy(s.has_planner(), s.planner(), &c.planner);
  Copy(s.has_replicas(), s.replicas(), &c.replicas);
  Copy(s.has_overlap_allreduce(), s.overlap_allreduce(), &c.overlap_allreduce);
  Copy(s.has_bucket_kib(), s.bucket_kib(), &c.bucket_kib);
  Copy(s.has_microbatches(), s.microbatches(), &c.micro_batches);
  Copy(s.has_microbatch_size(), s.microbatch_size(), &c.micro_batch_size);
  Copy(s.has_steps(), s.steps(), &c.steps);
  Copy(s.has_seed(), s.seed(), &c.seed);
  Copy(s.has_threads_per_stage(), s.threads_per_stage(), &c.threads_per_stage);
  Copy(s.has_timeout_s(), s.timeout_s(), &c.recv_timeout_s);
  if (s.has_recompute()) {
    auto rc = job::ParseRecompute(s.recompute());
    if (rc.ok()) {
      c.recompute = *rc;
    } else {
      errors.push_back(std::string(rc.status().message()));
    }
  }
  if (s.has_dtype()) {
    absl::StatusOr<job::Precision> precision = job::ParsePrecision(s.dtype());
    if (precision.ok()) {
      c.precision = *precision;
    } else {
      errors.push_back(absl::StrCat("dtype: ", precision.status().message()));
    }
  }
  Copy(s.has_device(), s.device(), &c.device);
  if (s.has_weights_dir() && s.weights_dir().empty()) {
    errors.push_back("weights_dir: must not be empty when set");
  }
  Copy(s.has_weights_dir(), s.weights_dir(), &c.weights_dir);
  Copy(s.checkpoint().has_dir(), s.checkpoint().dir(), &c.checkpoint.dir);
  Copy(s.checkpoint().has_every(), s.checkpoint().every(), &c.checkpoint.every);
  Copy(s.checkpoint().has_keep(), s.checkpoint().keep(), &c.checkpoint.keep);
  Copy(s.has_resume_from(), s.resume_from(), &c.resume_from);
  Copy(s.has_max_restarts(), s.max_restarts(), &c.max_restarts);
  Copy(s.has_nonfinite_limit(), s.nonfinite_limit(), &c.nonfinite_limit);
  for (const std::string& v : ViolationsOf(job::ValidateJobConfig(c))) {
    // ValidateJobConfig prefixes its list with "invalid job: ".
    constexpr absl::string_view kPrefix = "invalid job: ";
    errors.push_back(absl::StartsWith(v, kPrefix) ? v.substr(kPrefix.size()) : v);
  }
  if (!errors.empty()) return InvalidArgumentList("invalid job", errors);
  return c;
}

void MarkForPlanning(v1::JobSpec* spec) {
  spec->set_auto_stages(true);
  spec->clear_stage_ranges();
}

v1::JobSpec SpecWithLayoutOf(const v1::JobSpec& spec, const job::JobConfig& planned) {
  v1::JobSpec out = spec;
  out.clear_auto_stages();
  out.set_schedule(std::string(schedule::ScheduleKindName(planned.schedule)));
  out.set_stages(job::PipelineStages(planned));
  if (planned.virtual_stages > 0) {
    out.set_virtual_stages(planned.virtual_stages);
  } else {
    out.clear_virtual_stages();
  }
  out.clear_stage_ranges();
  for (const model::LayerRange& r : planned.stage_ranges) {
    v1::LayerRange* range = out.add_stage_ranges();
    range->set_begin(r.begin);
    range->set_end(r.end);
  }
  out.set_replicas(planned.replicas);
  out.set_microbatches(planned.micro_batches);
  out.set_microbatch_size(planned.micro_batch_size);
  out.set_overlap_allreduce(planned.overlap_allreduce);
  out.set_recompute(job::FormatRecompute(planned.recompute));
  return out;
}

}  // namespace pipetrain::jobspec
