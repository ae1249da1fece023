#!/usr/bin/python3
"""Automatic recovery of a job under faults, with real daemons on loopback.

Part 1, one fault of each kind, each in a fresh cluster (a coordinator and 5 workers: one
spare, so the next generation can keep the layout) running the default GPT as 2 stages x 2
replicas (1f1b, m = 4, b = 8, AdamW) with a checkpoint every --every steps:
  kill        a worker of the job is SIGKILLed mid-step
  hang        a worker of the job is SIGSTOPped (continued after the job recovered)
  transport   the data-plane TCP connections of one worker are closed under it (`ss -K`)
  coordinator the coordinator is SIGKILLed and started again on the same port and database
For each: detection (the fault -> the coordinator ends the generation; for "coordinator":
the kill -> the restarted coordinator loaded the job), re-plan (-> the next generation's
ranks assigned), first good step (-> every rank finished its first step after the
restart point: rendezvous, the state taken from the survivors' workers or read from the
checkpoint, and that step), total (the fault -> first good step), where it restarted from
(the survivors' newest common step, their state taken from memory or read from their
checkpoint, or the last checkpoint),
and the steps lost (run by the failed generation after the checkpoint it resumed from; 0
when its survivors went on). Times come from the job's recovery record (coordinator wall
clock, ms) against this script's time.time() at the fault.

Part 2, goodput: the same job for --minutes with a fault every --fault-every seconds (the
kinds in turn). Goodput = steps committed / (the run's own fault-free rate x the time): the
fault-free rate is the median rate of committed steps over the minute before each fault
(minus 5 s), measured in the same run, so the machine's drift between runs does not enter.
For reference, a separate fault-free run of the same length is also reported, without
restarts (so without the step commit a job with restarts and replicas runs with: its cost is
in the ratio; runs minutes apart on this machine differ by several percent).

Markdown on stdout, progress on stderr; standard library only. Needs root for `ss -K`
(the transport fault; skipped without it).

Run:  /usr/bin/python3 bench/recovery.py [--build build] [--minutes 10] [--fault-every 120]
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

SPEC = """name: recovery-bench
model: {{name: gpt, d_model: 64, n_heads: 4, n_layers: 4}}
schedule: 1f1b
stages: 2
replicas: 2
microbatches: 4
microbatch_size: 8
steps: 1000000
threads_per_stage: 1
optimizer: {{name: adamw, lr: 3.0e-3}}
timeout_s: 60
max_restarts: {restarts}
checkpoint: {{dir: {ckpt}, every: {every}, keep: 3}}
"""
KINDS = ["kill", "hang", "transport", "coordinator"]


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def status(cluster, job):
    out = cluster.cli(["status", job, "-o", "json"], check=False).stdout
    try:
        return json.loads(out)
    except ValueError:
        return None


def i64(obj, key, default=0):
    return int(obj.get(key, default))


def wait_for(cluster, job, done, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = status(cluster, job)
        if j is not None and done(j):
            return j
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting on {job}:\n{status(cluster, job)}\n"
                     f"{cluster.log('coordinator')[-3000:]}")


def worker_name(cluster, worker_id):
    for _, name, m in cluster.lines_matching(r"registered as (worker-\d+) "):
        if m.group(1) == worker_id:
            return name
    raise SystemExit(f"no process registered as {worker_id}")


def close_transport(cluster, name):
    """Closes the worker's data-plane TCP connections (not its gRPC or metrics ones)."""
    pid = cluster.named[name].pid
    service, metrics = cluster.worker_ports(name)
    coordinator_port = int(cluster.address.rsplit(":", 1)[1])
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True,
                         text=True).stdout
    closed = 0
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        fields = line.split()
        local, peer = fields[2], fields[3]
        lport, pport = int(local.rsplit(":", 1)[1]), int(peer.rsplit(":", 1)[1])
        if lport in (service, metrics) or pport == coordinator_port:
            continue
        subprocess.run(["ss", "-K", "src", local.rsplit(":", 1)[0], "sport", "=", str(lport)],
                       capture_output=True)
        closed += 1
    return closed


def inject(cluster, job_status, kind, spare_names):
    """Applies fault `kind` to the job; returns the time.time() of the fault."""
    ranks = job_status["stage_status"]
    victim = worker_name(cluster, ranks[1]["worker_id"])  # stage 1 of replica 0
    now = time.time()
    if kind == "kill":
        cluster.named[victim].kill()
        spare_names.append(victim)
    elif kind == "hang":
        os.kill(cluster.named[victim].pid, signal.SIGSTOP)
        spare_names.append("stopped:" + victim)
    elif kind == "transport":
        if close_transport(cluster, victim) == 0:
            raise SystemExit("no data-plane connection of the worker found to close")
    elif kind == "coordinator":
        cluster.restart_coordinator()
    return now


def heal(cluster, spare_names):
    """Continues stopped workers and starts one for each killed one."""
    while spare_names:
        name = spare_names.pop()
        if name.startswith("stopped:"):
            os.kill(cluster.named[name[8:]].pid, signal.SIGCONT)
        else:
            cluster.start_worker(name + "r")


def submit(cluster, every, restarts=100):
    path = os.path.join(cluster.dir, "job.yaml")
    with open(path, "w") as f:
        f.write(SPEC.format(ckpt=os.path.join(cluster.dir, "ckpt"), every=every,
                            restarts=restarts))
    out = cluster.cli(["submit", path]).stdout
    return re.search(r"job-\d+", out).group(0)


def running_past_checkpoint(generation, margin=5):
    def done(j):
        return (j.get("state") == "JOB_STATE_RUNNING" and int(j.get("generation", 0)) == generation
                and i64(j, "checkpoint_step") > 0
                and i64(j, "step", -1) >= i64(j, "checkpoint_step") + margin)
    return done


def one_fault(build, kind, every):
    with LocalCluster(build, workers=5) as cluster:
        cluster.wait_for_idle_workers(5)
        job = submit(cluster, every)
        j = wait_for(cluster, job, running_past_checkpoint(1, margin=every // 2))
        spare = []
        fault = inject(cluster, j, kind, spare)
        j = wait_for(cluster, job, lambda j: len(j.get("recoveries", [])) == 1 and
                     i64(j["recoveries"][0], "first_step_unix_ms") > 0)
        r = j["recoveries"][0]
        detected, placed, first = (i64(r, k) / 1e3 for k in
                                   ("detected_unix_ms", "placed_unix_ms", "first_step_unix_ms"))
        heal(cluster, spare)
        # Where the next generation's state came from: the survivors' workers' memory (each
        # rank's first report says so in the events), or a checkpoint read.
        events = cluster.cli(["logs", job], check=False).stdout
        in_memory = "the ranks take the survivors' state at step" in events
        cluster.cli(["cancel", job], check=False)
        survivors = bool(r.get("from_survivors", False))
        return {"kind": kind, "detect": detected - fault, "replan": placed - detected,
                "first_step": first - placed, "total": first - fault,
                "from": ("survivors (memory)" if in_memory else "survivors (checkpoint read)")
                if survivors else "checkpoint",
                "lost": 0 if survivors else
                i64(r, "failed_after_step", -1) + 1 - i64(r, "resumed_at_step"),
                "layout": f'{r.get("stages")}x{r.get("replicas")}x{r.get("microbatches")}'}


def goodput_run(build, minutes, fault_every, every, kinds):
    """Steps committed in `minutes` from the first step, with a fault every `fault_every` s
    (kinds in turn) or none; and the rate of committed steps in the clean minute before each
    fault."""
    with LocalCluster(build, workers=5) as cluster:
        cluster.wait_for_idle_workers(5)
        job = submit(cluster, every, restarts=100 if kinds else 0)
        wait_for(cluster, job, lambda j: i64(j, "step", -1) >= 0)
        start = time.monotonic()
        end = start + minutes * 60
        spare, faults, k = [], 0, 0
        samples, fault_times = [], []  # (monotonic s, last committed step)
        next_fault = start + fault_every if kinds else float("inf")
        while time.monotonic() < end:
            j = status(cluster, job)
            if j is not None:
                samples.append((time.monotonic(), i64(j, "step", -1)))
            if time.monotonic() >= next_fault:
                if j and j.get("state") == "JOB_STATE_RUNNING" and j.get("stage_status") and \
                        not j.get("message", "").startswith("recovering"):
                    kind = kinds[k % len(kinds)]
                    log(f"  fault {faults + 1}: {kind} at step {i64(j, 'step', -1)}")
                    fault_times.append(time.monotonic())
                    inject(cluster, j, kind, spare)
                    faults += 1
                    k += 1
                    next_fault += fault_every
            if spare and faults and time.monotonic() > next_fault - fault_every + 20:
                heal(cluster, spare)
            time.sleep(0.5)
        j = status(cluster, job)
        steps = i64(j, "step", -1) + 1
        cluster.cli(["cancel", job], check=False)
        rates = []
        for f in fault_times:
            window = [(t, s) for t, s in samples if f - 60 <= t <= f - 5]
            if len(window) >= 2 and window[-1][0] > window[0][0]:
                rates.append((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]))
        clean_rate = statistics.median(rates) if rates else None
        return steps, faults, int(j.get("restarts", 0)), clean_rate


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--fault-every", type=float, default=120)
    parser.add_argument("--every", type=int, default=50, help="checkpoint interval (steps)")
    parser.add_argument("--repeats", type=int, default=1, help="faults of each kind (part 1)")
    parser.add_argument("--part", choices=["all", "faults", "goodput"], default="all")
    args = parser.parse_args()
    kinds = list(KINDS)
    if os.geteuid() != 0 or subprocess.run(["ss", "-V"], capture_output=True).returncode:
        log("no root or no ss: the transport fault is left out")
        kinds.remove("transport")

    rows = []
    for kind in (kinds if args.part != "goodput" else []):
        for i in range(args.repeats):
            log(f"fault: {kind} ({i + 1}/{args.repeats})")
            rows.append(one_fault(args.build, kind, args.every))
            log("  ", rows[-1])
    if rows:
        print(f"Recovery of a 2-stage x 2-replica default GPT (1f1b, m = 4, b = 8), checkpoint every "
              f"{args.every} steps, heartbeat 1 s, 5 workers (one spare); median of "
              f"{args.repeats} per kind (seconds):\n")
        print("| fault | detection | re-plan | rendezvous + restore + first step | fault -> first "
              "good step | restarted from | steps lost | layout after |")
        print("|---|---|---|---|---|---|---|---|")
        for kind in kinds:
            rs = [r for r in rows if r["kind"] == kind]
            med = {k: statistics.median(r[k] for r in rs) for k in
                   ("detect", "replan", "first_step", "total", "lost")}
            origin = "/".join(sorted({r["from"] for r in rs}))
            print(f"| {kind} | {med['detect']:.2f} | {med['replan']:.2f} | {med['first_step']:.2f} "
                  f"| {med['total']:.2f} | {origin} | {med['lost']:.0f} | {rs[-1]['layout']} |")

    if args.minutes > 0 and args.part != "faults":
        log(f"goodput: {args.minutes} min with a fault every {args.fault_every} s")
        faulty, faults, restarts, rate = goodput_run(args.build, args.minutes, args.fault_every,
                                                     args.every, kinds)
        log(f"goodput: {args.minutes} min fault-free (reference)")
        free, _, _, _ = goodput_run(args.build, args.minutes, args.fault_every, args.every, [])
        seconds = args.minutes * 60
        print(f"\nGoodput over {args.minutes:g} minutes from the first step, a fault every "
              f"{args.fault_every:g} s ({', '.join(kinds)} in turn):\n")
        print("| run | faults | restarts | steps committed | steps/s | goodput |")
        print("|---|---|---|---|---|---|")
        print(f"| with faults | {faults} | {restarts} | {faulty} | {faulty / seconds:.2f} | "
              f"**{faulty / (rate * seconds):.3f}** against its own clean rate "
              f"({rate:.2f} steps/s) |" if rate else f"| with faults | {faults} | {restarts} | "
              f"{faulty} | {faulty / seconds:.2f} | (no clean window) |")
        print(f"| fault-free, a separate run without restarts (no step commit) | 0 | 0 | {free} | "
              f"{free / seconds:.2f} | {faulty / free:.3f} (faulty / fault-free) |")


if __name__ == "__main__":
    main()
