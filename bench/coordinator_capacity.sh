#!/usr/bin/env bash
# coordinator_capacity.sh: starts a pipetrain-coordinator on loopback with a fresh SQLite
# file in a temporary folder, runs bench/coordinator_capacity against it (N simulated
# workers, Heartbeat and ReportStep from T client threads), prints its markdown table, and
# stops the coordinator.
#
# Run:  bench/coordinator_capacity.sh [BUILD_DIR] [coordinator_capacity flags]
#       bench/coordinator_capacity.sh build-bench --workers 64 --threads 1,8 --seconds 3
# (BUILD_DIR defaults to build-bench; it needs pipetrain-coordinator and coordinator_capacity,
# built with the daemons on.) About 20 s with the defaults.
set -euo pipefail

BUILD_DIR="build-bench"
if [[ $# -gt 0 && "$1" != -* ]]; then
  BUILD_DIR="$1"
  shift
fi
readonly BUILD_DIR
readonly COORDINATOR="${BUILD_DIR}/coordinator/pipetrain-coordinator"
readonly BENCH="${BUILD_DIR}/bench/coordinator_capacity"
for bin in "${COORDINATOR}" "${BENCH}"; do
  if [[ ! -x "${bin}" ]]; then
    echo "not an executable: ${bin} (ninja -C ${BUILD_DIR} pipetrain-coordinator coordinator_capacity)" >&2
    exit 2
  fi
done

TMP="$(mktemp -d)"
readonly TMP
COORDINATOR_PID=""
cleanup() {
  if [[ -n "${COORDINATOR_PID}" ]]; then
    kill "${COORDINATOR_PID}" 2>/dev/null || true
    wait "${COORDINATOR_PID}" 2>/dev/null || true
  fi
  rm -rf "${TMP}"
}
trap cleanup EXIT

"${COORDINATOR}" --listen 127.0.0.1:0 --db "${TMP}/jobs.db" 2>"${TMP}/coordinator.log" &
COORDINATOR_PID=$!
ADDRESS=""
for _ in $(seq 1 300); do
  ADDRESS="$(sed -n 's/.*listening on \([0-9.]*:[0-9]*\).*/\1/p' "${TMP}/coordinator.log" | head -n1)"
  [[ -n "${ADDRESS}" ]] && break
  if ! kill -0 "${COORDINATOR_PID}" 2>/dev/null; then break; fi
  sleep 0.1
done
if [[ -z "${ADDRESS}" ]]; then
  echo "the coordinator did not start:" >&2
  cat "${TMP}/coordinator.log" >&2
  exit 1
fi
echo "coordinator at ${ADDRESS} (database ${TMP}/jobs.db)" >&2
"${BENCH}" --coordinator "${ADDRESS}" "$@"
