#!/usr/bin/env bash
# deploy/slurm/pipetrain.sbatch on a real four-node Slurm cluster: each node a network
# namespace ("host") with an address of its own on a bridged private /24 and its own slurmd
# (NodeAddr = that address), slurmctld and every client call on a fifth, head namespace, one
# munged (own key and socket) for all of them. Everything lives in a fresh temporary directory
# and namespaces named after this process; it is all stopped by PID and removed at the end.
#
#   tests/deploy/slurm_multinode_test.sh BUILD_DIR
#
# a. sbatch -N 4 --ntasks-per-node=1 of a small 2-stage x 2-replica job: the Slurm job ends
#    COMPLETED 0:0, the pipetrain job succeeds, the coordinator ran on the first node and a
#    worker on every one of the four nodes (each serving on its node's address), and nothing
#    of the job is left running on any node;
# b. the same layout with max_restarts and a checkpoint policy, longer: once it runs, a node
#    that is not the first dies (its slurmd, slurmstepd and worker SIGKILLed, its link cut);
#    the pipetrain job goes on from its checkpoint on the workers left and succeeds, the
#    Slurm job ends COMPLETED 0:0 (once Slurm has marked that node DOWN), the output names
#    the dead node, and nothing of the job is left on the other nodes;
# c. on the three nodes left, a 3-stage job without restarts (max_restarts 0); one node's
#    slurmd and worker SIGKILLed: the pipetrain job fails naming the lost worker, the Slurm
#    job ends FAILED 1:0, the output names the node, and nothing of the job is left on the
#    nodes that remain;
# d. workers told to serve on an interface no node has: every task exits at start, and the
#    Slurm job ends FAILED 3:0 at once, the output naming the node and the cause.
# Exit 0: all passed; 1: a check failed (the Slurm logs and job outputs are printed);
# 77: skipped (no Slurm, munge or iproute2, not root, or network namespaces not allowed).
# PIPETRAIN_SLURM_SCRIPT replaces the batch script under test (to check that the test fails).
set -euo pipefail

export PATH=/usr/sbin:/sbin:$PATH
export LC_ALL=C
# Nothing of a surrounding Slurm job or pipetrain setup reaches the jobs (sbatch exports all).
while read -r v; do
  [[ "$v" == PIPETRAIN_SLURM_* ]] || unset "$v"
done < <(compgen -e | grep -E '^(SLURM|SBATCH|SRUN|PIPETRAIN)_' || true)

say() { printf 'slurm_multinode_test: %s\n' "$*"; }
build=${1:?usage: slurm_multinode_test.sh BUILD_DIR}
build=$(cd -- "$build" && pwd)
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
script=${PIPETRAIN_SLURM_SCRIPT:-$(cd -- "$here/../.." && pwd)/deploy/slurm/pipetrain.sbatch}

for b in munged slurmctld slurmd sbatch srun scontrol squeue scancel ip; do
  if ! command -v "$b" >/dev/null; then
    say "SKIP: $b is not installed (scripts/setup.sh installs slurm-wlm, munge and iproute2)"
    exit 77
  fi
done
if [[ "$(id -u)" -ne 0 ]]; then
  say "SKIP: network namespaces and slurmd need root; run this test as root"
  exit 77
fi
for b in coordinator/pipetrain-coordinator worker/pipetrain-worker client/pipetrain; do
  [[ -x "$build/$b" ]] || { say "FAIL: no $build/$b (build first)"; exit 1; }
done
[[ -r "$script" ]] || { say "FAIL: no batch script $script"; exit 1; }

nodes=4
prefix=ptsl$$                              # namespaces and links: ptslPID-*
subnet=10.233.$((1 + $$ % 250))            # the hosts' private /24
net_ns=$prefix-net                         # holds the bridge and the hosts' veth ends
host_ns() { echo "$prefix-h$1"; }          # 0: head (slurmctld, clients); 1..4: nodes n1..n4
host_addr() { echo "$subnet.$((10 + $1))"; }
# Programs enter a host with `nsenter --net=NETNS_FILE` rather than `ip netns exec`, which
# also mounts a /sys of its own: slurmd needs the cgroup file system under the real one.
netns_file() { echo "/run/netns/$(host_ns "$1")"; }
hc() {  # hc SECONDS COMMAND...: a client call (sbatch, scontrol, pipetrain) from the head host
  local t=$1
  shift
  timeout "$t" nsenter --net="$(netns_file 0)" "$@"
}

# Namespaces left by a run of this test that died without removing them, and whatever that
# run left running in them.
while read -r name _; do
  [[ "$name" =~ ^ptsl([0-9]+)- ]] || continue
  kill -0 "${BASH_REMATCH[1]}" 2>/dev/null && continue
  for p in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  ip netns del "$name" 2>/dev/null || true
done < <(ip netns list 2>/dev/null || true)

dir=$(mktemp -d "${TMPDIR:-/tmp}/pipetrain-slurm4.XXXXXX")
chmod 755 "$dir"  # munged asks that everyone may traverse its socket's directories
conf=$dir/slurm.conf
cli=$build/client/pipetrain

daemon_pids=()  # munged, slurmctld, the slurmds: stopped newest first
made_ns=()
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
  for f in "$dir"/log/slurmctld.log "$dir"/log/slurmd-*.log "$dir"/munge/munged.log; do
    [[ -r "$f" ]] || continue
    say "== last lines of $f"
    tail -n 60 -- "$f"
  done
  [[ ! -r "$dir/jobcomp.txt" ]] || { say "== $dir/jobcomp.txt"; cat -- "$dir/jobcomp.txt"; }
  for f in "$dir"/*.out "$dir"/*-state/*.log; do
    [[ -r "$f" ]] || continue
    say "== $f"
    tail -n 100 -- "$f"
  done
  for id in "${job_ids[@]}"; do
    say "== scontrol show job $id"
    hc 10 scontrol show job "$id" 2>&1 || true
  done
}

teardown() {
  local rc=$? pid p ns
  trap - EXIT INT TERM
  trap '' PIPE  # a reader of the output that went away must not cut the teardown short
  set +e
  ((failures == 0 && (rc == 0 || rc == 77))) || print_diagnostics
  for id in "${job_ids[@]}"; do hc 10 scancel "$id" 2>/dev/null; done
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
    [[ -n "$pid" ]] || continue  # a node's slurmd the test killed (and reaped)
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  # Anything still in the hosts' namespaces was started there by this test; then the
  # namespaces (with them their veth ends and the bridge).
  for ((i = ${#made_ns[@]} - 1; i >= 0; i--)); do
    ns=${made_ns[i]}
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  if [[ -n "${PIPETRAIN_SLURM_TEST_KEEP:-}" ]]; then
    say "kept $dir"
  else
    rm -rf -- "$dir"
  fi
  if ((rc == 0 && failures > 0)); then rc=1; fi
  case $rc in
    0) say "$((SECONDS - started)) s; PASSED" ;;
    77) say "$((SECONDS - started)) s; skipped" ;;
    *) say "$((SECONDS - started)) s; FAILED (exit $rc)" ;;
  esac
  exit "$rc"
}
trap teardown EXIT
trap 'say "interrupted"; exit 130' INT TERM

die() { say "FAIL: $*"; failures=$((failures + 1)); exit 1; }

# --- hosts: a namespace each, a veth into a bridge in a namespace of its own ---------------
# Where the machine allows no network namespaces (a chroot whose / is no mount point: `ip
# netns add` cannot set up /run/netns; no CAP_NET_ADMIN), the first step that fails says why
# and the test is skipped.
make_hosts() {
  ip netns add "$net_ns" || return 1
  made_ns+=("$net_ns")
  ip -n "$net_ns" link add br0 type bridge || return 1
  ip -n "$net_ns" link set br0 up || return 1
  local h ns
  for ((h = 0; h <= nodes; h++)); do
    ns=$(host_ns "$h")
    ip netns add "$ns" || return 1
    made_ns+=("$ns")
    ip link add "$prefix-v$h" netns "$net_ns" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$net_ns" link set "$prefix-v$h" master br0 up || return 1
    ip -n "$ns" link set lo up || return 1
    ip -n "$ns" addr add "$(host_addr "$h")/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
  done
  nsenter --net="$(netns_file 0)" true || return 1
}
if ! make_hosts 2>"$dir/netns.err"; then
  say "SKIP: cannot make network namespaces here ($(head -n 1 "$dir/netns.err"))"
  exit 77
fi
# --- munge: own key and socket (a Unix socket: every namespace reaches it) ------------------
mkdir -p "$dir"/{munge,log,state,run,bin,gpu}
for ((h = 1; h <= nodes; h++)); do mkdir -p "$dir/spool/n$h"; done
chmod 755 "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 600 "$dir/munge/munge.key"
munged -F --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed" >>"$dir/munge/munged.log" 2>&1 &
daemon_pids+=($!)
for _ in $(seq 50); do [[ -S "$dir/munge/munge.sock" ]] && break; sleep 0.1; done
[[ -S "$dir/munge/munge.sock" ]] || die "munged did not create its socket"

# --- Slurm: four nodes, one count-only GPU each (character devices) -------------------------
gres=("AutoDetect=off")
for ((h = 1; h <= nodes; h++)); do
  f=$dir/gpu/n$h-0
  mknod "$f" c 1 3 2>/dev/null || f=/dev/null  # no CAP_MKNOD: an existing char device
  gres+=("NodeName=n$h Name=gpu File=$f")
done
printf '%s\n' "${gres[@]}" >"$dir/gres.conf"
ctld_port=6817
slurmd_port=6818  # the same on every node: each has its own network stack
cat >"$conf" <<EOF
ClusterName=pipetrain-test4
SlurmctldHost=$(hostname -s)($(host_addr 0))
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
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
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
SlurmdTimeout=10
KillWait=5
MailProg=/bin/true
EOF
for ((h = 1; h <= nodes; h++)); do
  echo "NodeName=n$h NodeAddr=$(host_addr "$h") CPUs=2 Boards=1 SocketsPerBoard=1" \
    "CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:1 State=UNKNOWN" >>"$conf"
done
echo "PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP" >>"$conf"
export SLURM_CONF=$conf

nsenter --net="$(netns_file 0)" slurmctld -D -i >>"$dir/log/slurmctld.stderr" 2>&1 &
daemon_pids+=($!)
declare -A slurmd_pid
for ((h = 1; h <= nodes; h++)); do
  nsenter --net="$(netns_file "$h")" slurmd -D -N "n$h" >>"$dir/log/slurmd-n$h.stderr" 2>&1 &
  slurmd_pid[$h]=$!
  daemon_pids+=($!)
done

node_state() {  # node_state NODE: its State= in scontrol show node
  hc 5 scontrol show node -o "$1" 2>/dev/null | sed -n 's/.* State=\([^ ]*\).*/\1/p'
}
idle=0
for _ in $(seq 150); do
  idle=0
  for ((h = 1; h <= nodes; h++)); do
    [[ "$(node_state "n$h" || true)" != IDLE* ]] || idle=$((idle + 1))
  done
  ((idle < nodes)) || break
  for pid in "${daemon_pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || die "a daemon exited at start (pid $pid)"
  done
  sleep 0.2
done
((idle == nodes)) || die "only $idle of $nodes nodes idle after 30 s"
say "slurmctld at $(host_addr 0):$ctld_port, a slurmd on each of n1..n$nodes" \
  "($(host_addr 1)..$(host_addr "$nodes")), all idle after $((SECONDS - started)) s"

# The binaries in one directory, as PIPETRAIN_BIN wants them.
ln -s "$build/coordinator/pipetrain-coordinator" "$build/worker/pipetrain-worker" \
  "$build/client/pipetrain" "$dir/bin/"

cat >"$dir/small.yaml" <<'YAML'
model: {name: mlp, hidden: 16, hidden_layers: 3, input_dim: 8, num_classes: 4}
data: {kind: classification, num_samples: 1024}
schedule: 1f1b
stages: 2
replicas: 2
microbatches: 2
microbatch_size: 8
steps: 30
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
YAML

# --- helpers -------------------------------------------------------------------------------
# submit NAME NODES SPEC [VAR=VALUE...]: sbatch -N NODES, one task (one worker, one GPU) per
# node, from the head host, with those variables; the coordinator's port is the default 7070
# (each node has its own); prints the Slurm job id
submit() {
  local name=$1 n=$2 spec=$3 out
  shift 3
  out=$(cd "$dir" && hc 30 env PIPETRAIN_BIN="$dir/bin" PIPETRAIN_STATE_DIR="$dir/$name-state" \
    PIPETRAIN_STOP_TIMEOUT=10 "$@" \
    sbatch --parsable --job-name="pt-$name" --output="$dir/$name.out" \
    -N "$n" --ntasks-per-node=1 --gres=gpu:1 "$script" "$spec") || return 1
  echo "${out%%;*}"
}

job_field() {  # job_field ID FIELD: from scontrol show job
  hc 10 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
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

# jobcomp_entry ID: its jobcomp.txt line for the job's end (written as it ends; a job that
# loses a node also has a line for that, JobState=RESIZING)
jobcomp_entry() {
  local id=$1
  for _ in $(seq 50); do
    if grep "^JobId=$id " "$dir/jobcomp.txt" 2>/dev/null | grep -v "JobState=RESIZING "; then
      return 0
    fi
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

# only_slurmd_on HOSTS...: within 20 s, nothing runs in those hosts' namespaces but their
# slurmd
only_slurmd_on() {
  local h p left=""
  for _ in $(seq 100); do
    left=""
    for h in "$@"; do
      for p in $(ip netns pids "$(host_ns "$h")" 2>/dev/null); do
        [[ "$p" == "${slurmd_pid[$h]}" ]] ||
          left+="n$h: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c 1-160)"$'\n'
      done
    done
    [[ -n "$left" ]] || return 0
    sleep 0.2
  done
  say "still running:"
  printf '%s' "$left"
  return 1
}

contains() { grep -qE -- "$2" "$1"; }  # contains FILE REGEX
re() { printf '%s' "${1//./\\.}"; }  # re ADDRESS: an IPv4 address as an extended regex

# workers_on_every_node OUT STATEDIR: a task on each node said it serves at that node's
# address, and the workers' port files hold the four node addresses
workers_on_every_node() {
  local out=$1 state=$2 h ok=0 got want=""
  for ((h = 1; h <= nodes; h++)); do
    if ! contains "$out" "^pipetrain\.sbatch: task [0-9]+ on n$h: pipetrain-worker serving at $(re "$(host_addr "$h")")\$"; then
      say "no worker on n$h ($(host_addr "$h")) in $out"
      ok=1
    fi
    want+="$(host_addr "$h") "
  done
  got=$(for f in "$state"/worker-*.port; do head -n 1 "$f" | cut -d: -f1; done 2>/dev/null |
    sort -u | tr '\n' ' ')
  [[ "$got" == "$want" ]] || { say "the workers serve at '$got', not '$want'"; ok=1; }
  return "$ok"
}

host_of() {  # host_of PID: the number of the host (namespace) the process runs in
  local ns
  ns=$(ip netns identify "$1" 2>/dev/null) || return 1
  [[ "$ns" == "$prefix-h"* ]] || return 1
  echo "${ns#"$prefix-h"}"
}

# wait_running COORDINATOR STEPS: until its job runs with at least STEPS steps done (60 s)
wait_running() {
  local line
  for _ in $(seq 200); do
    line=$(hc 10 "$cli" list --coordinator "$1" -o json --timeout 5 2>/dev/null | tail -n 1) ||
      true
    if [[ "$line" == *'"state":"JOB_STATE_RUNNING"'* && "$line" =~ \"step\":\"([0-9]+)\" ]] &&
      ((BASH_REMATCH[1] >= $2)); then
      echo "${BASH_REMATCH[1]}"
      return 0
    fi
    sleep 0.3
  done
  return 1
}

# wait_pipetrain_end COORDINATOR SECONDS: until its job ends; prints its final state
wait_pipetrain_end() {
  local line deadline=$((SECONDS + $2))
  while ((SECONDS < deadline)); do
    line=$(hc 10 "$cli" list --coordinator "$1" -o json --timeout 5 2>/dev/null | tail -n 1) ||
      true
    if [[ "$line" =~ \"state\":\"JOB_STATE_(SUCCEEDED|FAILED|CANCELLED)\" ]]; then
      echo "${BASH_REMATCH[1]}"
      return 0
    fi
    sleep 0.5
  done
  return 1
}

# kill_node HOST PID...: SIGKILLs those processes of the host (its slurmd among them: the test
# reaps it and no longer counts it as a daemon to stop)
kill_node() {
  local h=$1 p i
  shift
  for p in "$@"; do kill -KILL "$p" 2>/dev/null || true; done
  for ((i = 0; i < ${#daemon_pids[@]}; i++)); do
    [[ "${daemon_pids[i]}" != "${slurmd_pid[$h]}" ]] || daemon_pids[i]=""
  done
  wait "${slurmd_pid[$h]}" 2>/dev/null || true
}

describe() {  # describe PID...: "PID NAME" of each
  local p
  for p in "$@"; do printf '%s %s, ' "$p" "$(cat "/proc/$p/comm" 2>/dev/null)"; done | sed 's/, $//'
}

# --- a. a small job on four nodes completes --------------------------------------------------
id_a=$(submit a "$nodes" "$dir/small.yaml") || die "sbatch refused the small job"
job_ids+=("$id_a")
say "a: Slurm job $id_a: 2-stage x 2-replica MLP, 30 steps, on $nodes nodes"
state_a=$(wait_job_end "$id_a" 120) || true
comp_a=$(jobcomp_entry "$id_a") || comp_a=""
say "a: ended $state_a after $((SECONDS - started)) s"
check "a: the Slurm job ends COMPLETED (scontrol)" test "$state_a" = COMPLETED
check "a: the Slurm job's exit code is 0:0 (scontrol)" test "$(job_field "$id_a" ExitCode)" = 0:0
check "a: jobcomp.txt records COMPLETED with ExitCode=0:0 on n[1-4]" \
  contains <(echo "$comp_a") "JobState=COMPLETED .*NodeList=n\[1-4\] .*ExitCode=0:0"
check "a: the output shows the pipetrain job succeeded" \
  contains "$dir/a.out" "^job job-[0-9]+ succeeded"
check "a: the coordinator ran on the first node, n1, at its address" \
  contains "$dir/a.out" "^pipetrain\.sbatch: coordinator serving at $(re "$(host_addr 1)"):7070\$"
check "a: the script waited for the four workers to register" \
  contains "$dir/a.out" "^pipetrain\.sbatch: 4 workers registered"
check "a: a worker ran on every one of the four nodes, at its node's address" \
  workers_on_every_node "$dir/a.out" "$dir/a-state"
check "a: no process of the job is left (script, coordinator, workers, srun, slurmstepd)" \
  no_job_processes "$id_a" "$dir/a-state"
check "a: nothing but its slurmd runs on any node" only_slurmd_on 1 2 3 4


# --- b. a node dies mid-job: the job goes on from its checkpoint on the nodes left -----------
{
  sed 's/^steps: .*/steps: 1500/' "$dir/small.yaml"
  echo "max_restarts: 2"
  echo "checkpoint: {every: 20, keep: 2}"
} >"$dir/long.yaml"
id_b=$(submit b "$nodes" "$dir/long.yaml") || die "sbatch refused the long job"
job_ids+=("$id_b")
coord=$(host_addr 1):7070  # every job's coordinator, on n1
say "b: Slurm job $id_b: the same job with 1500 steps, max_restarts 2, a checkpoint every 20"
step=$(wait_running "$coord" 40) ||
  die "b: the pipetrain job was not seen running with 40 steps done within 60 s"
coord_pid=$(pgrep -f -- "pipetrain-coordinator .*--port-file $dir/b-state/coordinator\.port" |
  head -n 1) || true
worker_hosts=$(for p in $(pgrep -f -- "pipetrain-worker .*--port-file $dir/b-state/worker-"); do
  host_of "$p"
done | sort | tr '\n' ' ')
check "b: while it runs, the coordinator's process is on n1 (its network namespace)" \
  test "$(host_of "${coord_pid:-0}" || true)" = 1
check "b: while it runs, one worker process is on each of n1..n4" test "$worker_hosts" = "1 2 3 4 "

victim=3
mapfile -t victim_pids < <(ip netns pids "$(host_ns "$victim")")
what=$(describe "${victim_pids[@]}")
ip -n "$net_ns" link set "$prefix-v$victim" down
kill_node "$victim" "${victim_pids[@]}"
killed_at=$SECONDS
say "b: at step $step, n$victim died: its link cut, SIGKILL to $what"

job_b=$(wait_pipetrain_end "$coord" 120) || job_b="not seen to end"
say "b: the pipetrain job ended ($job_b) $((SECONDS - killed_at)) s after n$victim died"
state_b=$(wait_job_end "$id_b" 150) || true
comp_b=$(jobcomp_entry "$id_b") || comp_b=""
say "b: the Slurm job ended $state_b $((SECONDS - killed_at)) s after n$victim died" \
  "(n$victim: $(node_state "n$victim"))"
check "b: the Slurm job ends COMPLETED (scontrol)" test "$state_b" = COMPLETED
check "b: the Slurm job's exit code is 0:0 (scontrol)" test "$(job_field "$id_b" ExitCode)" = 0:0
check "b: jobcomp.txt records COMPLETED with ExitCode=0:0" \
  contains <(echo "$comp_b") "JobState=COMPLETED .*ExitCode=0:0"
check "b: the output shows the pipetrain job succeeded" \
  contains "$dir/b.out" "^job job-[0-9]+ succeeded"
check "b: the output names the dead node and its worker as the cause of the restart" \
  contains "$dir/b.out" "^pipetrain\.sbatch: job job-[0-9]+ restarted \(restart 1\): worker-[0-9]+ \($(re "$(host_addr "$victim")"):[0-9]+\) running stage [01] .*stopped sending heartbeats.* \(node n$victim\)\$"
check "b: the output has the restart's layout and timing (pipetrain status)" \
  contains "$dir/b.out" "^pipetrain\.sbatch: \|   after step [0-9]+, from step [0-9]+ \([^)]*\) on [12] stages x [12] replicas .*first good step [0-9.]+ s after the fault was seen"
check "b: Slurm marks n$victim DOWN" contains <(node_state "n$victim") "^DOWN"
check "b: no process of the job is left" no_job_processes "$id_b" "$dir/b-state"
check "b: nothing but its slurmd runs on n1, n2, n4" only_slurmd_on 1 2 4
recovered=$(sed -n 's/^pipetrain\.sbatch: |   after step \([0-9]*\), from step \([0-9]*\) ([^)]*) on \(.*\); first good step \([0-9.]*\) s after.*/after step \1, from step \2 on \3; first good step \4 s after the loss was seen/p' "$dir/b.out")
say "b: restart: ${recovered:-none}"

# --- c. no restarts allowed: the Slurm job fails naming the node -----------------------------
sed -e 's/^steps: .*/steps: 1000000/' -e 's/^stages: .*/stages: 3/' \
  -e 's/^replicas: .*/replicas: 1/' "$dir/small.yaml" >"$dir/norestart.yaml"
id_c=$(submit c 3 "$dir/norestart.yaml") || die "sbatch refused the third job"
job_ids+=("$id_c")
say "c: Slurm job $id_c: 3 stages x 1 replica on three nodes, max_restarts 0"
step=$(wait_running "$coord" 20) ||
  die "c: the pipetrain job was not seen running with 20 steps done within 60 s"
check "c: the job runs on the three nodes left (n[1-2,4])" \
  test "$(job_field "$id_c" NodeList)" = "n[1-2,4]"
victim=4
victim_worker=$(for p in $(pgrep -f -- "pipetrain-worker .*--port-file $dir/c-state/worker-"); do
  [[ "$(host_of "$p")" != "$victim" ]] || echo "$p"
done | head -n 1)
[[ -n "$victim_worker" ]] || die "c: no worker of the job on n$victim"
what=$(describe "${slurmd_pid[$victim]}" "$victim_worker")
kill_node "$victim" "${slurmd_pid[$victim]}" "$victim_worker"
killed_at=$SECONDS
say "c: at step $step, SIGKILL to n$victim's $what"

job_c=$(wait_pipetrain_end "$coord" 60) || job_c="not seen to end"
say "c: the pipetrain job ended ($job_c) $((SECONDS - killed_at)) s after the kill"
state_c=$(wait_job_end "$id_c" 120) || true
comp_c=$(jobcomp_entry "$id_c") || comp_c=""
say "c: the Slurm job ended $state_c $((SECONDS - killed_at)) s after the kill" \
  "(n$victim: $(node_state "n$victim"))"
check "c: the Slurm job ends FAILED (scontrol)" test "$state_c" = FAILED
check "c: the Slurm job's exit code is 1:0, the pipetrain job's (scontrol)" \
  test "$(job_field "$id_c" ExitCode)" = 1:0
check "c: jobcomp.txt records FAILED with ExitCode=1:0" \
  contains <(echo "$comp_c") "JobState=FAILED .*ExitCode=1:0"
addr_re=$(re "$(host_addr "$victim")")
check "c: the pipetrain job failed naming the lost worker at n$victim's address" \
  contains "$dir/c.out" "^job job-[0-9]+ failed: worker-[0-9]+ \($addr_re:[0-9]+\) running stage [0-2] .*stopped sending heartbeats"
check "c: the output names the node the job failed on" \
  contains "$dir/c.out" "^pipetrain\.sbatch: the job failed on node n$victim: worker-[0-9]+ \($addr_re:"
check "c: nothing of the job is left on n1, n2" only_slurmd_on 1 2
mapfile -t left < <(ip netns pids "$(host_ns "$victim")")
say "c: left on n$victim, its slurmd dead: ${left[*]:+$(describe "${left[@]}")}"

# --- d. a worker that cannot start stops the Slurm job at once -------------------------------
id_d=$(submit d 2 "$dir/small.yaml" PIPETRAIN_WORKER_IFACE=nosuch0) ||
  die "sbatch refused the fourth job"
job_ids+=("$id_d")
submitted_at=$SECONDS
say "d: Slurm job $id_d: workers told to serve on an interface no node has"
state_d=$(wait_job_end "$id_d" 60) || true
say "d: the Slurm job ended $state_d $((SECONDS - submitted_at)) s after sbatch"
check "d: the Slurm job ends FAILED with exit code 3:0 (the daemons did not start)" \
  test "$state_d $(job_field "$id_d" ExitCode)" = "FAILED 3:0"
check "d: within 30 s of sbatch, not PIPETRAIN_START_TIMEOUT's 120 s" \
  test $((SECONDS - submitted_at)) -le 30
check "d: the output names the node and the task that ended, and why" \
  contains "$dir/d.out" "^pipetrain\.sbatch: a worker task ended before every worker registered \(0 of 2\): srun: error: n[12]: tasks? [0-9]"
check "d: the task said why" \
  contains "$dir/d.out" "^pipetrain\.sbatch: task [01] on n[12]: no IPv4 address on interface nosuch0"
check "d: no process of the job is left" no_job_processes "$id_d" "$dir/d-state"

say "passed ${#passed[@]} checks, failed $failures"
((failures == 0))
