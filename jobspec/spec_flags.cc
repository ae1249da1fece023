#include "jobspec/spec_flags.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "jobspec/spec_yaml.h"
#include "runtime/base/errors.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::jobspec {
namespace {

// The runtime's default of the field at `path`, as text ("" if it has none to show).
std::string RuntimeDefault(const std::string& path) {
  static const nlohmann::json defaults = nlohmann::json::parse(job::JobToJson({}));
  const nlohmann::json::json_pointer pointer("/" + absl::StrReplaceAll(path, {{".", "/"}}));
  if (!defaults.contains(pointer)) return "";
  const nlohmann::json& v = defaults.at(pointer);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::vector<std::string> items;
    for (const auto& item : v) items.push_back(item.dump());
    return absl::StrJoin(items, ",");
  }
  return v.dump();
}

}  // namespace

const std::vector<SpecFlag>& SpecFlagTable() {
  static const std::vector<SpecFlag> table = {
      {"--name", "name", "job", "a name shown by `pipetrain list`"},
      {"--weights-dir", "weights_dir", "job",
       "a directory: every rank writes its final parameters and buffers to "
       "<dir>/stage<RANK>.pt where it runs (rank = replica * stages + stage)"},

      {"--checkpoint-dir", "checkpoint.dir", "job",
       "where checkpoints keyed by layer go: DIR/step-N/ and DIR/latest"},
      {"--checkpoint-every", "checkpoint.every", "job",
       "a checkpoint before every step that is a multiple of this, and one after the last "
       "step (0: none)"},
      {"--checkpoint-keep", "checkpoint.keep", "job", "complete checkpoints kept"},
      {"--resume-from", "resume_from", "job",
       "start from a checkpoint: latest (under --checkpoint-dir), a checkpoint directory or "
       "root, or a root's latest file"},
      {"--max-restarts", "max_restarts", "job",
       "worker daemons: restarts after a fault, each from the latest checkpoint on the "
       "workers that remain, before the job fails"},
      {"--nonfinite-limit", "nonfinite_limit", "job",
       "a step with a non-finite loss or gradient is skipped on every rank; this many in a "
       "row fail the job"},

      {"--model", "model.name", "model", "gpt | mlp | cnn | vgg | torchscript"},
      {"--torchscript", "model.path", "model",
       "TorchScript file of an nn.Sequential (sets --model torchscript)", nullptr, "model.name",
       "torchscript"},
      {"--d-model", "model.d_model", "model", "gpt width"},
      {"--n-heads", "model.n_heads", "model", "gpt attention heads"},
      {"--n-layers", "model.n_layers", "model", "gpt transformer blocks"},
      {"--dropout", "model.dropout", "model", "dropout probability (gpt)"},
      {"--tie-embeddings", "model.tie_embeddings", "model",
       "gpt: the LM head's weight is the token embedding's (true/false)", "false"},
      {"--tie", "model.tie", "model",
       "torchscript tie groups A=B[=C],...: parameters named child.parameter, one parameter"},
      {"--hidden", "model.hidden", "model", "mlp width / cnn channels / vgg first-stage channels"},
      {"--hidden-layers", "model.hidden_layers", "model",
       "mlp/cnn hidden layers; vgg depth 11|13|16|19"},
      {"--input-dim", "model.input_dim", "model", "mlp input features"},
      {"--image-shape", "model.image_shape", "model", "cnn/vgg input C,H,W"},
      {"--num-classes", "model.num_classes", "model", "mlp/cnn/vgg classes"},

      {"--data", "data.kind", "data", "synthetic | bytes | uint16 | classification",
       "synthetic (gpt) or classification (mlp, cnn, vgg)"},
      {"--data-path", "data.path", "data", "file for bytes / uint16 data"},
      {"--seq-len", "data.seq_len", "data", "tokens per sequence (T)"},
      {"--vocab", "data.vocab", "data", "synthetic vocabulary (uint16: 0 infers it)"},
      {"--branching", "data.branching", "data", "synthetic: successors per token"},
      {"--num-tokens", "data.num_tokens", "data", "synthetic: corpus length in tokens"},
      {"--num-samples", "data.num_samples", "data", "classification: samples"},
      {"--data-seed", "data.seed", "data", "seed of the synthetic data"},

      {"--schedule", "schedule", "pipeline",
       "gpipe | 1f1b (alias flush, last-stage) | 2bw | pipedream (weight stashing) | "
       "interleaved | zb1p | zbv | dualpipev (the last four hold --virtual-stages model "
       "stages a rank)"},
      {"--stages", "stages", "pipeline",
       "number of stages (balanced split), layer ranges: 0:2,2:4,4:7, or auto (planned: "
       "see --planner); with interleaved, zb1p, zbv or dualpipev the number of ranks, and "
       "ranges give every model stage (ranks x virtual stages)"},
      {"--virtual-stages", "virtual_stages", "pipeline",
       "model stages (chunks) a rank holds under interleaved (>= 2), zb1p (1: ZB-H1, >= 2: "
       "interleaved zero-bubble), zbv and dualpipev (2); 0: the schedule's default",
       "0 (interleaved, zbv, dualpipev: 2; zb1p: 1)"},
      {"--vertical-sync", "vertical_sync", "pipeline",
       "pipedream: every stage runs a micro-batch on the weight version stage 0 ran it on "
       "(PipeDream's vertical sync; true/false)",
       "false"},
      {"--planner", "planner", "pipeline",
       "with --stages auto: 2bw (throughput, PipeDream-2BW) | pipedream (throughput, "
       "1F1B, PipeDream's partitioner) | hippie (memory efficiency, last-stage schedule)",
       "2bw"},
      {"--replicas", "replicas", "pipeline",
       "data-parallel replicas of the pipeline (w); gradients averaged"},
      {"--overlap-allreduce", "overlap_allreduce", "pipeline",
       "Hippie: stage 0 averages gradient buckets during its final backward (true/false)"},
      {"--bucket-kib", "bucket_kib", "pipeline",
       "gradient bucket size for the overlapped AllReduce"},
      {"--microbatches", "microbatches", "pipeline", "micro-batches per step (m)"},
      {"--microbatch-size", "microbatch_size", "pipeline", "rows per micro-batch (b)"},
      {"--recompute", "recompute", "pipeline", "none | all | stages:I,J | layers:I,J"},
      {"--threads-per-stage", "threads_per_stage", "pipeline",
       "intra-op threads per stage (0: cores / stages)"},
      {"--peer-timeout", "timeout_s", "pipeline", "seconds any wait for a peer may last"},

      {"--steps", "steps", "training", "optimizer steps"},
      {"--optimizer", "optimizer.name", "training", "adamw | sgd"},
      {"--lr", "optimizer.lr", "training", "learning rate"},
      {"--weight-decay", "optimizer.weight_decay", "training",
       "weight decay: decoupled for adamw (AdamW's rule), coupled for sgd (added to the "
       "gradient, as torch.optim.SGD does)"},
      {"--no-decay", "optimizer.no_decay", "training",
       "kinds of parameter without weight decay: bias,norm,embedding (default none)"},
      {"--clip-grad-norm", "optimizer.clip_grad_norm", "training",
       "clip the whole model's gradient to this 2-norm before each update (0: off)"},
      {"--momentum", "optimizer.momentum", "training", "sgd momentum"},
      {"--beta1", "optimizer.beta1", "training", "adamw: decay of the first moment"},
      {"--beta2", "optimizer.beta2", "training", "adamw: decay of the second moment"},
      {"--eps", "optimizer.eps", "training", "adamw: added to the denominator"},
      {"--warmup-steps", "optimizer.schedule.warmup_steps", "training",
       "learning-rate warm-up: update t < N uses lr (t + 1) / N, so lr is reached at t = N - 1 "
       "and the decay starts from lr at t = N (lr is used twice). E.g. --lr 0.003 "
       "--warmup-steps 5 --lr-decay cosine --steps 20: 0.0006 0.0012 0.0018 0.0024 0.003 0.003 "
       "0.002967 ... (Megatron's --lr-warmup-iters W --lr-decay-iters D: --warmup-steps W "
       "--lr-decay-steps D-W, the same rates from t = W on; docs/design.md 4.7a)"},
      {"--lr-decay", "optimizer.schedule.decay", "training",
       "after the warm-up: constant | linear | cosine, from lr down to --min-lr"},
      {"--lr-decay-steps", "optimizer.schedule.decay_steps", "training",
       "the decay's length in steps, counted from the end of the warm-up (not from step 0); 0: "
       "the steps after the warm-up"},
      {"--min-lr", "optimizer.schedule.min_lr", "training",
       "the learning rate the decay ends at (and keeps)"},
      {"--eval-every", "eval.every", "training",
       "evaluate held-out data before every step that is a multiple of this (0: never)"},
      {"--eval-batches", "eval.batches", "training",
       "micro-batches each replica evaluates each time"},
      {"--eval-split", "eval.split", "training",
       "the fraction of the data held out of training for evaluation"},
      {"--seed", "seed", "training", "initialization and data order"},
      {"--dtype", "dtype", "training",
       "float32 | float64 | bfloat16 (bf16 compute and messages, float32 weights)"},
      {"--device", "device", "training", "cpu | cuda"},
  };
  return table;
}

SpecFlags::SpecFlags(CLI::App* app) {
  std::map<std::string, CLI::Option_group*> groups;
  for (const SpecFlag& flag : SpecFlagTable()) {
    CLI::Option_group*& group = groups[flag.group];
    if (group == nullptr) group = app->add_option_group(flag.group);
    auto value = std::make_shared<std::string>();
    CLI::Option* option = group->add_option(flag.name, *value, flag.help);
    const std::string default_text =
        flag.default_text != nullptr ? flag.default_text : RuntimeDefault(flag.path);
    if (!default_text.empty()) option->default_str(default_text);
    option->type_name(flag.path);
    bound_.push_back({&flag, option, std::move(value)});
  }
}

absl::Status SpecFlags::ApplyTo(v1::JobSpec* spec) const {
  std::vector<std::string> errors;
  for (const Bound& b : bound_) {
    if (b.option->count() == 0) continue;
    std::vector<std::string> field_errors;
    SetSpecField(b.flag->path, *b.value, spec, &field_errors);
    if (b.flag->also_path != nullptr) {
      SetSpecField(b.flag->also_path, b.flag->also_value, spec, &field_errors);
    }
    for (const std::string& e : field_errors) {  // "steps: expected ..." names the flag too
      const size_t colon = std::min(e.find(": "), e.size());
      errors.push_back(absl::StrCat(b.flag->name, " (", e.substr(0, colon), ")", e.substr(colon)));
    }
  }
  if (errors.empty()) return absl::OkStatus();
  return InvalidArgumentList("invalid job", errors);
}

absl::StatusOr<v1::JobSpec> BuildJobSpec(const std::string& job_file, const SpecFlags& flags) {
  v1::JobSpec spec;
  if (!job_file.empty()) {
    absl::StatusOr<v1::JobSpec> loaded = LoadJobSpec(job_file);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(job_file, ": ", loaded.status().message()));
    }
    spec = *std::move(loaded);
  }
  if (absl::Status s = flags.ApplyTo(&spec); !s.ok()) return s;
  return spec;
}

}  // namespace pipetrain::jobspec
