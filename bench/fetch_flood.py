#!/usr/bin/python3
"""A training worker's step rate with and without a flood of keyless FetchLayerState calls.

FetchLayerState (the survivors' state a worker holds) is the one WorkerService call that
needs no command key, so anyone who reaches a worker's port can call it. Without the key it
is refused before anything is looked at (worker/worker_service.h); this measures what a flood
of such calls costs a worker that trains. It starts a coordinator and 2 workers
(bench/local_cluster.py), runs a long 2-stage job, and alternates windows of --window seconds:
  quiet    nothing but the job;
  flooded  bench's fetch_flood (C++, --threads threads calling as fast as they can) at
           worker0's WorkerService;
with a 3 s rest between windows, --repeats times each, which side goes first alternating.
Steps per window come from the job's committed step (`pipetrain status`). "ratio" is the
median over repeats of flooded / quiet steps, each flooded window against the quiet one next
to it. The flood shares this machine's cores with the job, so the ratio holds the flooder's
own CPU too: it is an upper bound on what the worker's refusals cost. What they cost the
worker alone is measured first, with a flood at it while it runs nothing (its CPU seconds
from /proc over the refused calls); --nice 19 runs the flooder on what the job leaves.
Markdown on stdout, progress on stderr. Standard library only.

Run:  /usr/bin/python3 bench/fetch_flood.py [--build build] [--repeats 3] [--window 10]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

SPEC = """model: {name: gpt, d_model: 64, n_heads: 4, n_layers: 4}
data: {kind: synthetic, vocab: 64, seq_len: 32}
schedule: 1f1b
stages: 2
microbatches: 4
microbatch_size: 8
steps: 1000000
threads_per_stage: 1
"""


def committed_step(cluster, job):
    return int(json.loads(cluster.cli(["status", job, "-o", "json"]).stdout).get("step", -1))


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def window(cluster, job, seconds, worker_pid, flood=None):
    """(steps committed during `seconds`, the flooded worker's CPU seconds meanwhile, the
    flooder's line), with `flood` (argv) running meanwhile if given."""
    proc = None
    if flood is not None:
        proc = subprocess.Popen(flood, stdout=subprocess.PIPE, text=True)
    start = committed_step(cluster, job)
    cpu0 = cpu_seconds(worker_pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    steps = committed_step(cluster, job) - start
    cpu = cpu_seconds(worker_pid) - cpu0
    elapsed = time.monotonic() - t0
    line = ""
    if proc is not None:
        line = proc.communicate(timeout=seconds + 30)[0].strip()
    return steps * seconds / elapsed, cpu * seconds / elapsed, line


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=float, default=10)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--nice", type=int, default=0,
                    help="the flooder's niceness (19: it takes only what the job leaves)")
    args = ap.parse_args()
    flood_bin = os.path.join(args.build, "bench", "fetch_flood")
    if not os.access(flood_bin, os.X_OK):
        raise SystemExit(f"{flood_bin} is not built (ninja -C {args.build} fetch_flood)")
    with LocalCluster(args.build, workers=2) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.wait_for_idle_workers(2)
        service, _ = cluster.worker_ports("worker0")
        worker_pid = cluster.named["worker0"].pid
        flood = ["nice", "-n", str(args.nice), flood_bin, f"127.0.0.1:{service}",
                 str(args.window), str(args.threads)]
        # What a refused call costs the worker alone: a flood at it while it runs nothing.
        cpu0 = cpu_seconds(worker_pid)
        idle_line = subprocess.run(flood, stdout=subprocess.PIPE, text=True,
                                   check=True).stdout.strip()
        idle_cpu = cpu_seconds(worker_pid) - cpu0
        idle_calls = int(idle_line.split()[1])
        print(f"idle worker0: {idle_cpu:.2f} CPU-s for {idle_line}", file=sys.stderr)
        spec = os.path.join(tmp, "job.yaml")
        with open(spec, "w") as f:
            f.write(SPEC)
        job = cluster.cli(["submit", spec]).stdout.strip()
        while committed_step(cluster, job) < 20:
            time.sleep(0.5)
        rows, ratios = [], []
        for r in range(args.repeats):
            order = ["quiet", "flooded"] if r % 2 == 0 else ["flooded", "quiet"]
            got = {}
            for side in order:
                time.sleep(3)
                got[side] = window(cluster, job, args.window, worker_pid,
                                   flood if side == "flooded" else None)
                steps, cpu, line = got[side]
                print(f"repeat {r}: {side}: {steps:.0f} steps, worker0 {cpu:.2f} CPU-s in "
                      f"{args.window:.0f} s {line}", file=sys.stderr)
            ratios.append(got["flooded"][0] / got["quiet"][0])
            rows.append((r, got["quiet"], got["flooded"]))
        cluster.cli(["cancel", job])
    w = f"{args.window:.0f}"
    print(f"flooder: {args.threads} threads at nice {args.nice}\n")
    print(f"idle worker0 (no job): {idle_cpu:.2f} CPU-s for {idle_calls} refused calls, "
          f"{idle_cpu / max(1, idle_calls) * 1e6:.0f} us each\n")
    print(f"| repeat | quiet: steps / {w} s | worker0 CPU-s | flooded: steps / {w} s "
          f"| worker0 CPU-s | flood |")
    print("|---|---|---|---|---|---|")
    for r, quiet, flooded in rows:
        print(f"| {r} | {quiet[0]:.0f} | {quiet[1]:.2f} | {flooded[0]:.0f} | {flooded[1]:.2f} "
              f"| {flooded[2]} |")
    print(f"\nflooded / quiet steps, median of {args.repeats}: {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
