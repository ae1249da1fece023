#!/usr/bin/env bash
# run_all.sh: builds what the benchmarks need (if needed) and runs all of them, printing
# markdown ready for docs/performance.md on stdout (progress goes to stderr):
#   1. pipeline_efficiency.py  gpipe / 1f1b / 2bw, 2 and 4 stages, m = 4, 8, 16
#   2. overhead_bench          pipetrain 1 stage vs. a plain LibTorch loop, in one process
#   3. versus_python.sh        pipetrain 1 stage vs. the same GPT in eager PyTorch
#   4. transport_throughput    the Gloo transport vs. raw loopback TCP, 64 KiB..64 MiB
#   5. data_parallel.py        Hippie's exposed AllReduce; stages as processes vs. threads
#
# Run from anywhere:  bench/run_all.sh            (build dir: build-bench)
#                     BUILD_DIR=build JOBS=2 bench/run_all.sh > /tmp/perf.md
# About 20 minutes on 2 cores, plus the build.
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
echo "building pipetrain and overhead_bench in ${BUILD_DIR}..." >&2
ninja -j"${JOBS:-1}" -C "${BUILD_DIR}" pipetrain overhead_bench transport_throughput >&2
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

section "Runtime overhead vs. a plain LibTorch loop (bench/overhead_bench)"
start=${SECONDS}
"${BUILD_DIR}/bench/overhead_bench"
echo >&2 "overhead_bench: $((SECONDS - start)) s"

section "Versus eager PyTorch (bench/versus_python.sh)"
start=${SECONDS}
bench/versus_python.sh "${BIN}"
echo >&2 "versus_python: $((SECONDS - start)) s"

section "Transport throughput (bench/transport_throughput)"
start=${SECONDS}
"${BUILD_DIR}/bench/transport_throughput"
echo >&2 "transport_throughput: $((SECONDS - start)) s"

section "Data x pipeline parallelism (bench/data_parallel.py)"
start=${SECONDS}
"${PY}" bench/data_parallel.py "${BIN}"
echo >&2 "data_parallel: $((SECONDS - start)) s"
