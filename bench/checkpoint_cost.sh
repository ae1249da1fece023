#!/usr/bin/env bash
# What checkpoints cost (docs/reliability.md):
#  1. throughput of the default job (`pipetrain run --launch threads`, the default GPT) with
#     no checkpoint and with one every 50 steps, runs interleaved ROUNDS times (this machine
#     is noisy), tokens/s from --summary (first to last step end, so every checkpoint's
#     stall is inside); overhead = 1 - with / without (medians);
#  2. the write time (first stage's delivery to commit, as the run reports it) and size of a
#     checkpoint of the default GPT and of a GPT of about 113M parameters (d_model 768, 16
#     blocks, one stage; AdamW, so three tensors per parameter).
# Run: bench/checkpoint_cost.sh [path/to/pipetrain]   (ROUNDS=3 STEPS=400 by default)
set -euo pipefail
cli=${1:-build/client/pipetrain}
rounds=${ROUNDS:-3}
steps=${STEPS:-400}
tmp=$(mktemp -d /tmp/pipetrain-ckpt-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
py=/usr/bin/python3

field() { "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
median() { "$py" -c "import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }

without=() with=() writes=()
for round in $(seq 1 "$rounds"); do
  for mode in without with; do
    rm -rf "$tmp/ckpt"
    extra=()
    [[ $mode == with ]] && extra=(--checkpoint-every 50 --checkpoint-dir "$tmp/ckpt")
    "$cli" run --launch threads -q --steps "$steps" --summary "$tmp/s.json" "${extra[@]}" \
      2> "$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    tps=$(field "$tmp/s.json" tokens_per_s)
    echo "round $round $mode: $tps tok/s" >&2
    if [[ $mode == with ]]; then
      with+=("$tps")
      while read -r s; do writes+=("$s"); done < <(sed -n 's/.*committed: .* (\(.*\) MB in \(.*\) s)/\2/p' "$tmp/err")
      size_default=$(sed -n 's/.*committed: .* (\(.*\) MB in .*/\1/p' "$tmp/err" | tail -1)
    else
      without+=("$tps")
    fi
  done
done
a=$(median "${without[@]}") b=$(median "${with[@]}") w=$(median "${writes[@]}")
overhead=$("$py" -c "print(f'{(1 - $b / $a) * 100:.2f}')")

echo "113M-parameter GPT: 2 steps, a checkpoint before step 1 ..." >&2
rm -rf "$tmp/big"
"$cli" run --launch threads -q --stages 1 --d-model 768 --n-heads 12 --n-layers 16 \
  --seq-len 64 --microbatches 1 --microbatch-size 1 --steps 2 --checkpoint-every 1 \
  --checkpoint-dir "$tmp/big" --summary "$tmp/big.json" 2> "$tmp/big.err" || { cat "$tmp/big.err" >&2; exit 1; }
big_line=$(grep "committed:" "$tmp/big.err" | tail -1)
big_mb=$(echo "$big_line" | sed -n 's/.*(\(.*\) MB in .*/\1/p')
big_s=$(echo "$big_line" | sed -n 's/.* MB in \(.*\) s)/\1/p')
big_model=$(field "$tmp/big.json" model)

cat <<EOF
Checkpoint cost, \`$cli run --launch threads\` (the default job: $(field "$tmp/s.json" model)),
$steps steps, $rounds interleaved rounds, medians:

| | tokens/s | checkpoint write | size |
|---|---|---|---|
| no checkpoint | $(printf %.0f "$a") | | |
| one every 50 steps | $(printf %.0f "$b") | $w s | $size_default MB |
| **overhead** | **$overhead %** | | |

One checkpoint of a larger model ($big_model, AdamW state included): $big_mb MB written
in $big_s s.
EOF
