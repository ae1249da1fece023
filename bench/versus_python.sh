#!/usr/bin/env bash
# versus_python.sh: pipetrain (1 stage) vs. the same GPT in eager PyTorch (python_gpt.py).
#
# For T intra-op threads (1 and 2), runs, interleaved for ROUNDS rounds (alternating which
# goes first):
#   pipetrain run --stages 1 --schedule 1f1b --microbatches 1 --microbatch-size 64
#                 --threads-per-stage T          (step_time_s of the JSON summary)
#   OPENBLAS_NUM_THREADS=T python_gpt.py --threads T --rows 64   (eager PyTorch, same GPT)
# and, for T > 1, python_gpt.py once more with OPENBLAS_NUM_THREADS=1 (LibTorch's OpenMP
# pool and OpenBLAS's pool each with T spinning workers fight over 2 cores; with one BLAS
# thread they do not). Both sides run 64 rows x 32 tokens per step and report the median
# step time after warm-up; the table has the median over rounds and python/pipetrain.
#
# Run:  bench/versus_python.sh [PIPETRAIN_BINARY]   (default build/client/pipetrain)
#       ROUNDS=4 STEPS=30 THREADS="1 2" bench/versus_python.sh build-bench/client/pipetrain
# Needs /usr/bin/python3 with torch (Debian's python3-torch). About 1.5 minutes.
set -euo pipefail

readonly BIN="${1:-build/client/pipetrain}"
readonly ROUNDS="${ROUNDS:-4}"
readonly STEPS="${STEPS:-30}"
readonly THREADS="${THREADS:-1 2}"
readonly PY=/usr/bin/python3
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE

if [[ ! -x "${BIN}" ]]; then
  echo "not an executable: ${BIN} (build it, or pass its path)" >&2
  exit 2
fi
if ! "${PY}" -c 'import torch' 2>/dev/null; then
  echo "${PY} cannot import torch (install python3-torch)" >&2
  exit 2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

# Prints one step time in seconds.
json_field() { "${PY}" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
median() { "${PY}" -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1:])))' "$@"; }
ms() { "${PY}" -c 'import sys; print(f"{float(sys.argv[1]) * 1e3:.2f}")' "$1"; }
ratio() { "${PY}" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.3f}")' "$1" "$2"; }

run_pipetrain() {  # T
  # --steps STEPS+1: the first step (warm-up) is not in step_time_s.
  "${BIN}" run --launch threads --stages 1 --schedule 1f1b --microbatches 1 --microbatch-size 64 \
    --threads-per-stage "$1" --steps "$((STEPS + 1))" --summary "${tmp}/summary.json" -q
  json_field "${tmp}/summary.json" step_time_s
}

run_python() {  # T OPENBLAS_THREADS
  OPENBLAS_NUM_THREADS="$2" OMP_NUM_THREADS="$1" "${PY}" "${HERE}/python_gpt.py" \
    --threads "$1" --steps "${STEPS}" --rows 64 > "${tmp}/python.json"
  json_field "${tmp}/python.json" step_time_s
}

echo "| threads | pipetrain ms | PyTorch eager ms (OPENBLAS_NUM_THREADS=T) | python/pipetrain | PyTorch eager ms (OPENBLAS_NUM_THREADS=1) | python/pipetrain |"
echo "|---|---|---|---|---|---|"
for t in ${THREADS}; do
  pt=() py=() py1=()
  for ((round = 0; round < ROUNDS; ++round)); do
    if ((round % 2 == 0)); then
      pt+=("$(run_pipetrain "${t}")")
      py+=("$(run_python "${t}" "${t}")")
      if ((t > 1)); then py1+=("$(run_python "${t}" 1)"); fi
    else
      if ((t > 1)); then py1+=("$(run_python "${t}" 1)"); fi
      py+=("$(run_python "${t}" "${t}")")
      pt+=("$(run_pipetrain "${t}")")
    fi
    echo "  T=${t} round ${round}: pipetrain ${pt[-1]} s, python ${py[-1]} s${py1:+, python (1 BLAS thread) ${py1[-1]} s}" >&2
  done
  a="$(median "${pt[@]}")"
  b="$(median "${py[@]}")"
  if ((t > 1)); then
    c="$(median "${py1[@]}")"
    extra="$(ms "${c}") | $(ratio "${c}" "${a}")"
  else
    extra="(same) | (same)"
  fi
  echo "| ${t} | $(ms "${a}") | $(ms "${b}") | $(ratio "${b}" "${a}") | ${extra} |"
done
echo
echo "GPT d_model 64, 4 heads, 4 blocks, seq 32, vocab 64; 64 rows per step; AdamW lr 3e-3;" \
  "median step time over ${STEPS} steps after warm-up, median over ${ROUNDS} interleaved rounds;" \
  "torch $("${PY}" -c 'import torch; print(torch.__version__)')."
