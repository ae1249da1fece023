# Helpers the Slurm tests share (sourced by slurm_test.sh and slurm_multinode_test.sh). They
# use the sourcing script's `say`, `passed`, `failures` and `conf` (its slurm.conf).

check() {  # check DESCRIPTION COMMAND...: runs COMMAND, records the outcome
  local what=$1
  shift
  if "$@"; then
    passed+=("$what")
    say "ok: $what"
  else
    failures=$((failures + 1))
    say "FAILED: $what"
  fi
}

# The processes of this test's Slurm job, as "PID COMMAND LINE": those whose command line
# names the job's state directory (coordinator, workers, srun) or whose environment is the
# job's (SLURM_JOB_ID with this test's SLURM_CONF: the batch script and all it starts), and
# the job's slurmstepd processes ("slurmstepd: [ID.STEP]" with this test's SLURM_CONF,
# inherited from slurmd). Builtins only: it runs in polling loops.
job_processes() {  # job_processes JOBID STATEDIR
  local id=$1 state=$2 p cmd env IFS=$'\n'
  local -a words
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ "$p" != "$$" && "$p" != "$BASHPID" ]] || continue
    mapfile -d '' words 2>/dev/null <"/proc/$p/cmdline" || continue
    ((${#words[@]} > 0)) || continue  # a kernel thread or a zombie
    cmd=${words[*]}
    cmd=${cmd//$'\n'/ }
    mapfile -d '' words 2>/dev/null <"/proc/$p/environ" || words=()
    env=$'\n'${words[*]}$'\n'
    [[ "$env" == *$'\n'"SLURM_CONF=$conf"$'\n'* ]] || { [[ "$cmd" == *"$state"* ]] || continue; }
    if [[ "$cmd" == *"$state"* || "$cmd" == "slurmstepd: [$id."* ||
      "$env" == *$'\n'"SLURM_JOB_ID=$id"$'\n'* ]]; then
      echo "$p $cmd"
    fi
  done
}
