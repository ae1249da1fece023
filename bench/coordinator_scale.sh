#!/usr/bin/env bash
# coordinator_scale.sh: the control plane against a growing cluster. For each N, a fresh
# pipetrain-coordinator (its own SQLite file) and N simulated workers (coordinator_capacity
# --scale): registered at most REGISTER_PER_S a second, one job of 8 stages x N/8 replicas
# over all of them, then SECONDS of the cluster at its real cadence (a heartbeat per worker
# per second, a step report per rank per second), the job's status, the workers listing and
# the end of the job timed. Prints one markdown table, a row per N.
#
# Run:  bench/coordinator_scale.sh [BUILD_DIR] [N ...]
#       bench/coordinator_scale.sh build-bench 256 1024 2048 4096
# Env:  SECONDS_PER_N (default 10), REGISTER_PER_S (default 500), STAGES (default 8).
# About 30 s per N.
set -euo pipefail

BUILD_DIR="build-bench"
if [[ $# -gt 0 && ! "$1" =~ ^[0-9]+$ ]]; then
  BUILD_DIR="$1"
  shift
fi
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(256 1024 2048 4096)
readonly COORDINATOR="${BUILD_DIR}/coordinator/pipetrain-coordinator"
readonly BENCH="${BUILD_DIR}/bench/coordinator_capacity"
for bin in "${COORDINATOR}" "${BENCH}"; do
  if [[ ! -x "${bin}" ]]; then
    echo "not an executable: ${bin} (ninja -C ${BUILD_DIR} pipetrain-coordinator coordinator_capacity)" >&2
    exit 2
  fi
done

header=""
for n in "${sizes[@]}"; do
  echo "N = ${n}..." >&2
  out=$("${BENCH}" --start-coordinator "${COORDINATOR}" --scale --workers "${n}" \
    --stages "${STAGES:-8}" --seconds "${SECONDS_PER_N:-10}" \
    --register-per-s "${REGISTER_PER_S:-500}" 2> >(sed 's/^/  /' >&2)) || {
    echo "| ${n} | (the run failed: see above) |"
    continue
  }
  if [[ -z "${header}" ]]; then
    header=1
    grep -E '^\| workers|^\|---' <<<"${out}"
  fi
  grep -E "^\| ${n} " <<<"${out}"
  sleep 5  # a rest between sizes
done
