// One small job with a non-default value in every field that a runnable GPT job can have,
// written twice: as a YAML job file and as the command-line flags of jobspec/spec_flags.h.
// The launch-mode tests (tests/cli, tests/daemons) run it in every mode and through
// `submit` and check that each runs exactly this job. (Every field alone, the model- and
// data-specific ones included, is tests/jobspec/jobspec_test.cc.)
#pragma once

#include <string>

namespace pipetrain::test {

// `weights_dir` is the only field left out: each run appends its own.
inline constexpr char kOneJobYaml[] = R"(name: "one job: every field"
model: {name: gpt, d_model: 16, n_heads: 2, n_layers: 2, dropout: 0.125}
data: {kind: synthetic, seq_len: 8, vocab: 16, branching: 3, num_tokens: 4096, seed: 7}
schedule: 1f1b
stages: [[0, 2], [2, 5]]
replicas: 1
overlap_allreduce: false
bucket_kib: 64
microbatches: 3
microbatch_size: 2
steps: 2
optimizer: {name: sgd, lr: 0.05, weight_decay: 0.01, momentum: 0.9, beta1: 0.8, beta2: 0.95, eps: 1.0e-6,
            schedule: {warmup_steps: 2, decay: cosine, decay_steps: 10, min_lr: 0.005},
            clip_grad_norm: 0.5, no_decay: [bias, norm]}
eval: {every: 1, batches: 2, split: 0.25}
recompute: all
seed: 11
dtype: float64
threads_per_stage: 1
timeout_s: 30
)";

inline constexpr char kOneJobFlags[] =
    "--name 'one job: every field' --model gpt --d-model 16 --n-heads 2 --n-layers 2 "
    "--dropout 0.125 --data synthetic --seq-len 8 --vocab 16 --branching 3 --num-tokens 4096 "
    "--data-seed 7 --schedule 1f1b --stages 0:2,2:5 --replicas 1 --overlap-allreduce false "
    "--bucket-kib 64 --microbatches 3 --microbatch-size 2 --steps 2 --optimizer sgd --lr 0.05 "
    "--weight-decay 0.01 --momentum 0.9 --beta1 0.8 --beta2 0.95 --eps 1e-6 --warmup-steps 2 "
    "--lr-decay cosine --lr-decay-steps 10 --min-lr 0.005 --clip-grad-norm 0.5 "
    "--no-decay bias,norm --eval-every 1 --eval-batches 2 --eval-split 0.25 --recompute all "
    "--seed 11 --dtype float64 --threads-per-stage 1 --peer-timeout 30";

}  // namespace pipetrain::test
