#!/usr/bin/env bash
# deploy/slurm/pipetrain.sbatch under real Slurm: munged, slurmctld and slurmd started here on
# loopback (own ports, own munge socket and key, one node with two count-only fake GPUs), all
# in a fresh temporary directory and stopped by PID at the end.
#
#   tests/deploy/slurm_test.sh BUILD_DIR
#
# a. a small 2-stage job (sbatch --gres=gpu:2 -n 2 --ntasks-per-node=2): the Slurm job ends
#    COMPLETED 0:0, the pipetrain job succeeds on the two workers, nothing of the job is left;
# b. a long job, one worker killed with SIGKILL once it runs: the Slurm job ends FAILED 1:0,
#    the pipetrain job failed naming the killed worker as lost, srun and the script name its
#    node, and no pipetrain-coordinator, pipetrain-worker, srun or slurmstepd of that job is
#    left.
# Exit 0: all passed; 1: a check failed (the Slurm logs and job outputs are printed);
# 77: skipped (no Slurm or munge daemons installed, or not root).
# PIPETRAIN_SLURM_SCRIPT replaces the batch script under test (to check that the test fails).
set -euo pipefail

export PATH=/usr/sbin:/sbin:$PATH
export LC_ALL=C
# Nothing of a surrounding Slurm job or pipetrain setup reaches the jobs (sbatch exports all).
while read -r v; do
  [[ "$v" == PIPETRAIN_SLURM_* ]] || unset "$v"
done < <(compgen -e | grep -E '^(SLURM|PIPETRAIN)_' || true)

say() { printf 'slurm_test: %s\n' "$*"; }
build=${1:?usage: slurm_test.sh BUILD_DIR}
build=$(cd -- "$build" && pwd)
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
script=${PIPETRAIN_SLURM_SCRIPT:-$(cd -- "$here/../.." && pwd)/deploy/slurm/pipetrain.sbatch}

for b in munged slurmctld slurmd sbatch srun scontrol squeue scancel; do
  if ! command -v "$b" >/dev/null; then
    say "SKIP: $b is not installed (scripts/setup.sh installs slurm-wlm and munge)"
    exit 77
  fi
done
if [[ "$(id -u)" -ne 0 ]]; then
  say "SKIP: slurmd runs jobs as their users only as root; run this test as root"
  exit 77
fi
for b in coordinator/pipetrain-coordinator worker/pipetrain-worker client/pipetrain; do
  [[ -x "$build/$b" ]] || { say "FAIL: no $build/$b (build first)"; exit 1; }
done
[[ -r "$script" ]] || { say "FAIL: no batch script $script"; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-slurm.XXXXXX")
chmod 755 "$dir"  # munged asks that everyone may traverse its socket's directories
node=ptnode
conf=$dir/slurm.conf
cli=$build/client/pipetrain

daemon_pids=()  # munged, slurmctld, slurmd: stopped newest first
job_ids=()
failures=0
passed=()
started=$SECONDS

# check and job_processes, shared with the other Slurm test.
# shellcheck source=tests/deploy/slurm_lib.sh
source "$here/slurm_lib.sh"

print_diagnostics() {
  local f
  say "---- diagnostics (work directory $dir) ----"
  for f in "$dir"/log/slurmctld.log "$dir"/log/slurmd.log "$dir"/munge/munged.log; do
    [[ -r "$f" ]] || continue
    say "== last lines of $f"
    tail -n 80 -- "$f"
  done
  [[ ! -r "$dir/jobcomp.txt" ]] || { say "== $dir/jobcomp.txt"; cat -- "$dir/jobcomp.txt"; }
  for f in "$dir"/*.out "$dir"/*-state/*.log; do
    [[ -r "$f" ]] || continue
    say "== $f"
    tail -n 100 -- "$f"
  done
  for id in "${job_ids[@]}"; do
    say "== scontrol show job $id"
    timeout 10 scontrol show job "$id" 2>&1 || true
  done
}

teardown() {
  local rc=$? pid p
  trap - EXIT INT TERM
  set +e
  ((failures == 0 && rc == 0)) || print_diagnostics
  for id in "${job_ids[@]}"; do timeout 10 scancel "$id" 2>/dev/null; done
  # Whatever of the jobs is still running (it should be nothing: checked above).
  for f in "$dir"/*-state; do
    [[ -d "$f" ]] || continue
    for id in "${job_ids[@]}"; do
      for p in $(job_processes "$id" "$f" | cut -d' ' -f1); do kill -KILL "$p" 2>/dev/null; done
    done
  done
  # The daemons, newest first; slurmd may ignore SIGTERM once its controller is gone.
  for ((i = ${#daemon_pids[@]} - 1; i >= 0; i--)); do
    pid=${daemon_pids[i]}
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  if [[ -n "${PIPETRAIN_SLURM_TEST_KEEP:-}" ]]; then
    say "kept $dir"
  else
    rm -rf -- "$dir"
  fi
  if ((rc == 0 && failures > 0)); then rc=1; fi
  say "$((SECONDS - started)) s; $([[ $rc -eq 0 ]] && echo PASSED || echo "FAILED (exit $rc)")"
  exit "$rc"
}
trap teardown EXIT
trap 'say "interrupted"; exit 130' INT TERM

die() { say "FAIL: $*"; failures=$((failures + 1)); exit 1; }

# --- free ports: none in use by any socket (/proc/net/tcp*, no iproute2 needed) ------------
used_ports() {
  local sl local_addr rest
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r sl local_addr rest; do
    [[ "$local_addr" == *:* && "$sl" != sl ]] || continue
    echo $((16#${local_addr##*:}))
  done
}
picked=" "
free_port() {
  local p used
  used=" $(used_ports | tr '\n' ' ') "
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))  # below the ephemeral range (32768-60999)
    if [[ "$used" != *" $p "* && "$picked" != *" $p "* ]]; then
      picked+="$p "
      echo "$p"
      return 0
    fi
  done
  return 1
}
ctld_port=$(free_port)
slurmd_port=$(free_port)

# --- munge: own key and socket ---------------------------------------------------------------
mkdir -p "$dir"/{munge,log,state,run,spool/$node,bin}
chmod 755 "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 600 "$dir/munge/munge.key"
munged -F --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed" >>"$dir/munge/munged.log" 2>&1 &
daemon_pids+=($!)
for _ in $(seq 50); do [[ -S "$dir/munge/munge.sock" ]] && break; sleep 0.1; done
[[ -S "$dir/munge/munge.sock" ]] || die "munged did not create its socket"

# --- Slurm: one node, two count-only GPUs (character devices: slurmd refuses plain files) --
gpu_files=()
for i in 0 1; do
  if mknod "$dir/fakegpu$i" c 1 3 2>/dev/null; then
    gpu_files+=("$dir/fakegpu$i")
  fi
done
if ((${#gpu_files[@]} < 2)); then  # mknod refused (no CAP_MKNOD): existing char devices
  gpu_files=(/dev/null /dev/zero)
fi
cat >"$dir/gres.conf" <<EOF
AutoDetect=off
NodeName=$node Name=gpu File=${gpu_files[0]}
NodeName=$node Name=gpu File=${gpu_files[1]}
EOF
cat >"$conf" <<EOF
ClusterName=pipetrain-test
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
MpiDefault=none
PropagateResourceLimits=NONE
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
SchedulerParameters=sched_min_interval=0
KillWait=5
MailProg=/bin/true
NodeName=$node NodeAddr=127.0.0.1 CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$conf
slurmctld -D -i >>"$dir/log/slurmctld.stderr" 2>&1 &
daemon_pids+=($!)
slurmd -D -N "$node" >>"$dir/log/slurmd.stderr" 2>&1 &
daemon_pids+=($!)

node_state=""
for _ in $(seq 150); do
  node_state=$(timeout 5 scontrol show node -o "$node" 2>/dev/null |
    sed -n 's/.* State=\([^ ]*\).*/\1/p') || true
  [[ "$node_state" == IDLE* ]] && break
  for pid in "${daemon_pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || die "a daemon exited at start (pid $pid)"
  done
  sleep 0.2
done
[[ "$node_state" == IDLE* ]] || die "node $node is not idle after 30 s (state '$node_state')"
say "slurmctld :$ctld_port, slurmd :$slurmd_port, node $node idle after" \
  "$((SECONDS - started)) s (GPU files ${gpu_files[*]})"

# The binaries in one directory, as PIPETRAIN_BIN wants them.
ln -s "$build/coordinator/pipetrain-coordinator" "$build/worker/pipetrain-worker" \
  "$build/client/pipetrain" "$dir/bin/"

cat >"$dir/small.yaml" <<'EOF'
model: {name: mlp, hidden: 16, hidden_layers: 3, input_dim: 8, num_classes: 4}
data: {kind: classification, num_samples: 1024}
schedule: 1f1b
stages: 2
replicas: 1
microbatches: 2
microbatch_size: 8
steps: 30
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
EOF
# About 500 steps/s here: it runs until a worker is killed (the test ends it in any case).
sed 's/^steps: .*/steps: 1000000/' "$dir/small.yaml" >"$dir/long.yaml"

# --- helpers -------------------------------------------------------------------------------
submit() {  # submit NAME PORT SPEC: prints the Slurm job id
  local name=$1 port=$2 spec=$3 out
  out=$(cd "$dir" && PIPETRAIN_BIN=$dir/bin PIPETRAIN_PORT=$port \
    PIPETRAIN_STATE_DIR=$dir/$name-state PIPETRAIN_WORKER_ADDR=127.0.0.1 \
    PIPETRAIN_COORDINATOR_LISTEN=127.0.0.1 PIPETRAIN_STOP_TIMEOUT=10 \
    timeout 30 sbatch --parsable --job-name="pt-$name" --output="$dir/$name.out" \
    --gres=gpu:2 -n 2 --ntasks-per-node=2 "$script" "$spec") || return 1
  echo "${out%%;*}"
}

job_field() {  # job_field ID FIELD: from scontrol show job
  timeout 10 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}

wait_job_end() {  # wait_job_end ID SECONDS: until a final state; prints it
  local id=$1 deadline=$((SECONDS + $2)) st=""
  while ((SECONDS < deadline)); do
    st=$(job_field "$id" JobState) || true
    case $st in
      PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | "") ;;
      *)
        echo "$st"
        return 0
        ;;
    esac
    sleep 0.3
  done
  echo "${st:-unknown} (still after $2 s)"
  return 1
}

jobcomp_entry() {  # jobcomp_entry ID: its jobcomp.txt line (written as the job ends)
  local id=$1
  for _ in $(seq 50); do
    if grep -m 1 "^JobId=$id " "$dir/jobcomp.txt" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

no_job_processes() {  # no_job_processes ID STATEDIR: within 20 s
  local left=""
  for _ in $(seq 100); do
    left=$(job_processes "$1" "$2")
    [[ -n "$left" ]] || return 0
    sleep 0.2
  done
  say "left running after job $1:"
  printf '%s\n' "$left" | cut -c 1-200
  return 1
}

contains() { grep -qE -- "$2" "$1"; }  # contains FILE REGEX

# --- a. a small job completes ----------------------------------------------------------------
port_a=$(free_port)
id_a=$(submit a "$port_a" "$dir/small.yaml") || die "sbatch refused the small job"
job_ids+=("$id_a")
say "a: Slurm job $id_a: 2-stage MLP, 30 steps, coordinator :$port_a"
state_a=$(wait_job_end "$id_a" 120) || true
comp_a=$(jobcomp_entry "$id_a") || comp_a=""
say "a: ended $state_a after $((SECONDS - started)) s"
check "a: the Slurm job ends COMPLETED (scontrol)" test "$state_a" = COMPLETED
check "a: the Slurm job's exit code is 0:0 (scontrol)" test "$(job_field "$id_a" ExitCode)" = 0:0
check "a: jobcomp.txt records COMPLETED with ExitCode=0:0" \
  contains <(echo "$comp_a") "JobState=COMPLETED .*ExitCode=0:0"
check "a: the output shows the pipetrain job succeeded" \
  contains "$dir/a.out" "^job job-[0-9]+ succeeded"
check "a: the coordinator ran the stages on two workers" \
  contains "$dir/a-state/coordinator.log" "running: stage 0 on worker-[0-9]+, stage 1 on worker-[0-9]+"
check "a: each worker served on the node's address (127.0.0.1)" \
  test "$(cat "$dir"/a-state/worker-{0,1}.port 2>/dev/null | grep -c '^127\.0\.0\.1:')" = 2
check "a: the script waited for both workers to register" \
  contains "$dir/a.out" "^pipetrain\.sbatch: 2 workers registered"
check "a: no process of the job is left (script, coordinator, workers, srun, slurmstepd)" \
  no_job_processes "$id_a" "$dir/a-state"

# --- b. a worker dies: the Slurm job fails, nothing is left --------------------------------
port_b=$(free_port)
id_b=$(submit b "$port_b" "$dir/long.yaml") || die "sbatch refused the long job"
job_ids+=("$id_b")
state_b_dir=$dir/b-state
say "b: Slurm job $id_b: the same job with 1000000 steps, coordinator :$port_b"

running=""
for _ in $(seq 200); do  # 60 s: Slurm's first scheduling pass, daemons' start
  line=$(timeout 10 "$cli" list --coordinator "127.0.0.1:$port_b" -o json --timeout 5 2>/dev/null |
    tail -n 1) || true
  if [[ "$line" == *'"state":"JOB_STATE_RUNNING"'* && "$line" =~ \"step\":\"[1-9] ]]; then
    running=$line
    break
  fi
  st=$(job_field "$id_b" JobState) || true
  [[ "$st" == PENDING || "$st" == RUNNING || "$st" == CONFIGURING || -z "$st" ]] ||
    die "b: the Slurm job ended ($st) before the pipetrain job was seen running"
  sleep 0.3
done
[[ -n "$running" ]] || die "b: the pipetrain job was not seen running with steps done within 60 s"
say "b: the coordinator reports the job running ($(sed -n 's/.*"step":"\([0-9]*\)".*/step \1/p' <<<"$running"))"

worker_pid() {  # worker_pid RANK: the pipetrain-worker of Slurm task RANK
  pgrep -f -- "pipetrain-worker .*--port-file $state_b_dir/worker-$1\.port" | head -n 1
}
pid0=$(worker_pid 0) || true
pid1=$(worker_pid 1) || true
[[ -n "$pid0" && -n "$pid1" ]] || die "b: did not find both workers (pids '$pid0' '$pid1')"
gpu_of() { tr '\0' '\n' <"/proc/$1/environ" | sed -n 's/^CUDA_VISIBLE_DEVICES=//p'; }
check "b: each worker sees its own GPU (CUDA_VISIBLE_DEVICES 0 and 1)" \
  test "$(gpu_of "$pid0"),$(gpu_of "$pid1")" = 0,1
# What the final check relies on: that it sees each kind of process while they run.
running_procs=$(job_processes "$id_b" "$state_b_dir")
seen_all() {
  local re
  for re in "/pipetrain-coordinator " "/pipetrain-worker .*worker-0\.port" \
    "/pipetrain-worker .*worker-1\.port" "^[0-9]+ srun " "/slurm_script " \
    "^[0-9]+ slurmstepd: \[$id_b\.batch\]" \
    "^[0-9]+ slurmstepd: \[$id_b\.0\]"; do
    grep -qE -- "$re" <<<"$running_procs" || { say "not seen: $re"; return 1; }
  done
}
check "b: the leftover check sees the running coordinator, workers, srun, script, slurmstepd" \
  seen_all
killed_addr=$(head -n 1 "$state_b_dir/worker-1.port")
kill -KILL "$pid1"
killed_at=$SECONDS
say "b: killed worker of task 1 (pid $pid1, $killed_addr) with SIGKILL"

state_b=$(wait_job_end "$id_b" 90) || true
comp_b=$(jobcomp_entry "$id_b") || comp_b=""
say "b: ended $state_b $((SECONDS - killed_at)) s after the kill"
check "b: the Slurm job ends FAILED (scontrol)" test "$state_b" = FAILED
check "b: the Slurm job's exit code is 1:0, the pipetrain job's (scontrol)" \
  test "$(job_field "$id_b" ExitCode)" = 1:0
check "b: jobcomp.txt records FAILED with ExitCode=1:0" \
  contains <(echo "$comp_b") "JobState=FAILED .*ExitCode=1:0"
killed_re=${killed_addr//./\\.}
check "b: the pipetrain job failed naming the killed worker as lost" contains "$dir/b.out" \
  "^job job-[0-9]+ failed: worker-[0-9]+ \($killed_re\) running stage [01] stopped sending heartbeats"
check "b: srun reports the killed task on $node (the other worker is not killed with it)" \
  contains "$dir/b.out" "^srun: error: $node: task 1: Killed"
check "b: the script names the node the job failed on" \
  contains "$dir/b.out" "^pipetrain\.sbatch: the job failed on node $node: worker-[0-9]+ \($killed_re\)"
check "b: no pipetrain-coordinator, pipetrain-worker, srun or slurmstepd of the job is left" \
  no_job_processes "$id_b" "$state_b_dir"

say "passed ${#passed[@]} checks, failed $failures"
((failures == 0))
