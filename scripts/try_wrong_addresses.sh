#!/usr/bin/env bash
# Tries, against the built daemons and CLI on loopback, the two ways of pointing pipetrain at
# the wrong address that once went badly (docs/reliability.md, "Round three"):
#   1. a second worker, and a second coordinator, started on the address a live one serves:
#      each must exit non-zero at once naming the address ("the port is in use"), and the
#      live worker must keep serving (it registers again after a coordinator restart);
#   2. `pipetrain profile-link --connect` at the coordinator's gRPC port: it must end within
#      15 s with exit 2 and say what answered there (it once hung 120 s, then aborted).
# Prints one line per check (ok / FAILED) and exits 1 if any failed.
#   scripts/try_wrong_addresses.sh [BUILD_DIR]   (default: build)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cli=$build/client/pipetrain
coordinator=$build/coordinator/pipetrain-coordinator
worker=$build/worker/pipetrain-worker
for b in "$cli" "$coordinator" "$worker"; do
  [[ -x "$b" ]] || { echo "try_wrong_addresses: $b is not built (scripts/build.sh)" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/pipetrain-wrong-addresses.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
failed=0
check() {  # check NAME CONDITION...: prints ok or FAILED
  local name=$1
  shift
  if "$@"; then echo "ok      $name"; else echo "FAILED  $name"; failed=1; fi
}
wait_for_file() {  # wait_for_file PATH: up to 20 s
  for _ in $(seq 200); do [[ -s "$1" ]] && return 0; sleep 0.1; done
  return 1
}

# A coordinator and a worker, each on a free port.
"$coordinator" --listen 127.0.0.1:0 --db "$dir/jobs.db" --metrics-listen '' \
  --port-file "$dir/coordinator.port" 2>"$dir/coordinator.log" &
pids+=($!)
wait_for_file "$dir/coordinator.port" || { echo "the coordinator did not start" >&2; exit 1; }
coordinator_address=$(head -n 1 "$dir/coordinator.port")
"$worker" --coordinator "$coordinator_address" --listen 127.0.0.1:0 --metrics-listen '' \
  --port-file "$dir/worker.port" 2>"$dir/worker.log" &
pids+=($!)
wait_for_file "$dir/worker.port" || { echo "the worker did not register" >&2; exit 1; }
worker_address=$(head -n 1 "$dir/worker.port")

# 1. Second daemons on the live ones' addresses.
timeout 20 "$worker" --coordinator "$coordinator_address" --listen "$worker_address" \
  --metrics-listen '' --register-timeout 5 2>"$dir/second-worker.log"
code=$?
check "a second worker on $worker_address exits 5 (it exited $code)" test "$code" -eq 5
check "... naming the address and that the port is in use" \
  grep -q -- "--listen $worker_address: cannot listen there (the port is in use" \
  "$dir/second-worker.log"
timeout 20 "$coordinator" --listen "$coordinator_address" --db "$dir/other.db" \
  --metrics-listen '' 2>"$dir/second-coordinator.log"
code=$?
check "a second coordinator on $coordinator_address exits 5 (it exited $code)" test "$code" -eq 5
check "... naming the address and that the port is in use" \
  grep -q -- "--listen $coordinator_address: cannot listen there (the port is in use" \
  "$dir/second-coordinator.log"
workers=$("$cli" workers --coordinator "$coordinator_address" -o json --timeout 5)
check "the live worker is still the one registered at $worker_address" \
  grep -q "\"address\":\"$worker_address\"" <<<"$workers"

# 2. profile-link at the coordinator's gRPC port.
start=$SECONDS
timeout 60 "$cli" profile-link --connect "$coordinator_address" --address 127.0.0.1 \
  2>"$dir/profile-link.log"
code=$?
took=$((SECONDS - start))
check "profile-link --connect $coordinator_address exits 2 (it exited $code)" test "$code" -eq 2
check "... within 15 s (it took $took s)" test "$took" -le 15
check "... saying what answered there" grep -q "speaks HTTP/2 (a gRPC server" "$dir/profile-link.log"
if [[ $failed -ne 0 ]]; then
  echo "--- logs"
  tail -n 5 "$dir"/*.log
fi
exit $failed
