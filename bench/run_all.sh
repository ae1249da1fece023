#!/usr/bin/env bash
# run_all.sh: builds what the benchmarks need (if needed) and runs all of them, printing
# markdown ready for docs/performance.md on stdout (progress goes to stderr):
#   1. pipeline_efficiency.py  gpipe / 1f1b / 2bw, 2 and 4 stages, m = 4, 8, 16
#      chunked_schedules.py    zb1p, interleaved, zbv, dualpipev against 1f1b, p = cores
#      split_backward_bench    a stage's B vs. zero-bubble's I+W, with and without the generic path
#   2. overhead_bench          pipetrain 1 stage vs. a plain LibTorch loop, in one process
#   3. versus_python.sh        pipetrain 1 stage vs. the same GPT in eager PyTorch
#      peers.py                a 6.5M-parameter GPT against eager PyTorch, DDP over Gloo and
#                              torch's Pipe: tokens/s, peak memory, memory efficiency
#      gemm_libraries.py       one stage with its products on oneDNN, OpenBLAS, LibTorch
#      plan_accuracy.py        the planner's predicted step time and memory against runs
#      gpt2_small.py           GPT-2 small's shape as stage processes per schedule, ME vs DP
#      training_recipe.py      gradient clipping and evaluation against a plain step, paired
#      allreduce_overlap.py    Hippie's overlapped AllReduce vs. after the backward, by bucket
#   4. transport_throughput    the Gloo transport vs. raw loopback TCP, 64 KiB..64 MiB
#   5. data_parallel.py        Hippie's exposed AllReduce; stages as processes vs. threads
#   6. control_plane_overhead.py  step time under the daemons vs. `pipetrain run --launch processes`
#   7. submit_to_first_step.py    `pipetrain submit` -> first finished step, 4 stages, broken down
#   8. coordinator_capacity.sh    Heartbeat / ReportStep calls/s and latency of a coordinator
#   9. scrape_overhead.py         step time with /metrics scraped every second vs. unscraped;
#      fetch_flood.py             a worker's step rate under a flood of keyless FetchLayerState
#  10. checkpoint_cost.sh         checkpoint write time, size, and step-time overhead
#  11. recovery.py                fault -> first good step per fault kind; goodput under faults
#                                 (its goodput part runs two 10-minute jobs: RECOVERY_MINUTES)
#   (6-9 and 11 only when the build has the daemons, PIPETRAIN_WITH_DAEMONS)
#
# Run from anywhere:  bench/run_all.sh            (build dir: build-bench)
#                     BUILD_DIR=build JOBS=2 bench/run_all.sh > /tmp/perf.md
# About 50 minutes on 2 cores, plus the build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly ROOT
BUILD_DIR="${BUILD_DIR:-build-bench}"
[[ "${BUILD_DIR}" == /* ]] || BUILD_DIR="${ROOT}/${BUILD_DIR}"
readonly BUILD_DIR
readonly PY=/usr/bin/python3
cd "${ROOT}"
scripts/setup.sh --bench  # Debian's python3-torch for the eager-PyTorch comparison

if [[ ! -f "${BUILD_DIR}/build.ninja" ]]; then
  echo "configuring ${BUILD_DIR}..." >&2
  cmake -S . -B "${BUILD_DIR}" -G Ninja -DPIPETRAIN_BUILD_TESTS=OFF -DPIPETRAIN_BUILD_BENCH=ON >&2
fi
DAEMONS=0
if grep -q '^PIPETRAIN_WITH_DAEMONS:BOOL=ON' "${BUILD_DIR}/CMakeCache.txt"; then DAEMONS=1; fi
readonly DAEMONS
TARGETS=(pipetrain pipetrain-run overhead_bench split_backward_bench transport_throughput)
if [[ ${DAEMONS} == 1 ]]; then
  TARGETS+=(pipetrain-coordinator pipetrain-worker coordinator_capacity)
fi
echo "building ${TARGETS[*]} in ${BUILD_DIR}..." >&2
ninja -j"${JOBS:-1}" -C "${BUILD_DIR}" "${TARGETS[@]}" >&2
readonly BIN="${BUILD_DIR}/client/pipetrain"

section() { echo; echo "### $1"; echo; }

echo "## Benchmarks"
echo
echo "- machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
  "$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
echo "- LibTorch / PyTorch $("${PY}" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')," \
  "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')," \
  "$(date -u '+%Y-%m-%d %H:%M UTC')"

section "Pipeline efficiency (bench/pipeline_efficiency.py)"
start=${SECONDS}
"${PY}" bench/pipeline_efficiency.py "${BIN}"
echo >&2 "pipeline_efficiency: $((SECONDS - start)) s"

section "Schedules with several stages a rank against 1F1B (bench/chunked_schedules.py)"
start=${SECONDS}
"${PY}" bench/chunked_schedules.py "${BIN}"
echo >&2 "chunked_schedules: $((SECONDS - start)) s"

section "The split backward on one stage (bench/split_backward_bench)"
start=${SECONDS}
"${BUILD_DIR}/bench/split_backward_bench" --rounds 9 --micro-batches 8
echo >&2 "split_backward_bench: $((SECONDS - start)) s"

section "Runtime overhead vs. a plain LibTorch loop (bench/overhead_bench)"
start=${SECONDS}
"${BUILD_DIR}/bench/overhead_bench"
echo >&2 "overhead_bench: $((SECONDS - start)) s"

section "Versus eager PyTorch (bench/versus_python.sh)"
start=${SECONDS}
bench/versus_python.sh "${BIN}"
echo >&2 "versus_python: $((SECONDS - start)) s"

section "Against PyTorch's peers (bench/peers.py)"
start=${SECONDS}
"${PY}" bench/peers.py "${BUILD_DIR}/run/pipetrain-run"
echo >&2 "peers: $((SECONDS - start)) s"

section "The fast path's GEMM library (bench/gemm_libraries.py)"
start=${SECONDS}
"${PY}" bench/gemm_libraries.py "${BUILD_DIR}/run/pipetrain-run"
echo >&2 "gemm_libraries: $((SECONDS - start)) s"

section "Transport throughput (bench/transport_throughput)"
start=${SECONDS}
"${BUILD_DIR}/bench/transport_throughput"
echo >&2 "transport_throughput: $((SECONDS - start)) s"

section "Data x pipeline parallelism (bench/data_parallel.py)"
start=${SECONDS}
"${PY}" bench/data_parallel.py "${BIN}"
echo >&2 "data_parallel: $((SECONDS - start)) s"

section "Planner predictions against measurements (bench/plan_accuracy.py)"
start=${SECONDS}
"${PY}" bench/plan_accuracy.py --build "${BUILD_DIR}"
echo >&2 "plan_accuracy: $((SECONDS - start)) s"

section "GPT-2 small's shape as stage processes (bench/gpt2_small.py)"
start=${SECONDS}
"${PY}" bench/gpt2_small.py --build "${BUILD_DIR}"
echo >&2 "gpt2_small: $((SECONDS - start)) s"

section "The training recipe: clipping and evaluation (bench/training_recipe.py)"
start=${SECONDS}
"${PY}" bench/training_recipe.py "${BIN}"
echo >&2 "training_recipe: $((SECONDS - start)) s"

section "Hippie's overlap on larger models (bench/allreduce_overlap.py)"
start=${SECONDS}
"${PY}" bench/allreduce_overlap.py --build "${BUILD_DIR}" --small --rounds 3 --steps 15
"${PY}" bench/allreduce_overlap.py --build "${BUILD_DIR}" --rounds 2 --steps 6
echo >&2 "allreduce_overlap: $((SECONDS - start)) s"

section "Memory per rank (bench/memory_per_rank.py)"
start=${SECONDS}
"${PY}" bench/memory_per_rank.py "${BUILD_DIR}/run/pipetrain-run"
echo >&2 "memory_per_rank: $((SECONDS - start)) s"

section "Reliability: checkpoint cost (bench/checkpoint_cost.sh)"
start=${SECONDS}
bench/checkpoint_cost.sh "${BUILD_DIR}/client/pipetrain"
echo >&2 "checkpoint_cost: $((SECONDS - start)) s"

if [[ ${DAEMONS} == 1 ]]; then
  section "Control plane: step time under the daemons (bench/control_plane_overhead.py)"
  start=${SECONDS}
  "${PY}" bench/control_plane_overhead.py --build "${BUILD_DIR}"
  echo >&2 "control_plane_overhead: $((SECONDS - start)) s"

  section "Control plane: submit to first step (bench/submit_to_first_step.py)"
  start=${SECONDS}
  "${PY}" bench/submit_to_first_step.py --build "${BUILD_DIR}"
  echo >&2 "submit_to_first_step: $((SECONDS - start)) s"

  section "Control plane: coordinator capacity (bench/coordinator_capacity.sh)"
  start=${SECONDS}
  bench/coordinator_capacity.sh "${BUILD_DIR}"
  echo >&2 "coordinator_capacity: $((SECONDS - start)) s"

  section "Control plane: scraping /metrics (bench/scrape_overhead.py)"
  start=${SECONDS}
  "${PY}" bench/scrape_overhead.py --build "${BUILD_DIR}" --repeats 8 --steps 200
  echo >&2 "scrape_overhead: $((SECONDS - start)) s"

  section "Control plane: a flood of keyless FetchLayerState calls (bench/fetch_flood.py)"
  start=${SECONDS}
  "${PY}" bench/fetch_flood.py --build "${BUILD_DIR}" --repeats 3 --window 10
  "${PY}" bench/fetch_flood.py --build "${BUILD_DIR}" --repeats 3 --window 10 --nice 19
  echo >&2 "fetch_flood: $((SECONDS - start)) s"

  section "Reliability: recovery and goodput (bench/recovery.py)"
  start=${SECONDS}
  "${PY}" bench/recovery.py --build "${BUILD_DIR}" --repeats 3 --minutes "${RECOVERY_MINUTES:-10}"
  echo >&2 "recovery: $((SECONDS - start)) s"
else
  echo >&2 "control-plane benchmarks skipped: ${BUILD_DIR} was built without the daemons"
fi
