#!/usr/bin/python3
"""Time from `pipetrain submit` to the first finished step of a 4-stage job.

Starts a pipetrain-coordinator (fresh SQLite file, loopback) and 4 pipetrain-worker
processes, waits until all 4 are idle, then --repeats times submits a 4-stage job (the
default GPT, 2bw, m = 8, b = 8, 3 steps, one intra-op thread per rank) with
`pipetrain submit JOB --follow -o json`, lets it finish, and places these moments on one
clock (this script's time.monotonic(); wall-clock stamps are converted with the offset
between time.time() and time.monotonic(); worker times are CLOCK_MONOTONIC too, the same
clock on one machine):
  t0         the submit command is started (a new pipetrain process)
  accepted   the coordinator stored the job: submitted_unix_ms of the job record (ms)
  id         the CLI printed the job id: the SubmitJob RPC returned
  assigned   the last of the 4 workers logged "running rank R of JOB": its AssignStage
             RPC arrived and its stage thread started (the worker's stderr, read as it comes)
  started    the last rank's first action began (records[0] in the rank's weights_dir/
             stage<R>.json): its plan is built (model, data), it joined the Gloo data plane
             through the job's rendezvous store on the coordinator, and its stage is built
  step 0     the last rank finished step 0 (steps[0].end_s in the same files)
  reported   the first job record with step >= 0 reached the CLI (WatchJob stream): every
             rank's step report for step 0 reached the coordinator
The coordinator sends the AssignStage calls while the SubmitJob reply travels back, so
"assigned" is measured from "accepted", not from "id". It prints the median of each
segment and of the total, and, for reference, the median time
of `pipetrain --version` (process start of the CLI, which links LibTorch). The daemons do
not expose when the Gloo rendezvous itself ends, so "assigned -> started" is plan +
rendezvous + stage build together. Markdown on stdout, progress on stderr; standard
library only.

Run:  /usr/bin/python3 bench/submit_to_first_step.py [--build build-bench] [--repeats 5]
About 20 s with the defaults on 2 cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

STAGES = 4
SPEC = """model: {{name: gpt, d_model: 64, n_heads: 4, n_layers: 4}}
schedule: 2bw
stages: 4
microbatches: 8
microbatch_size: 8
steps: {steps}
threads_per_stage: 1
optimizer: {{name: adamw, lr: 3.0e-3}}
weights_dir: {weights}
"""


class RunFailed(Exception):
    pass


def one_job(cluster, tmp, steps):
    weights = os.path.join(tmp, "weights")
    spec = os.path.join(tmp, "job.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(steps=steps, weights=weights))
    offset = time.time() - time.monotonic()  # wall = monotonic + offset
    lines = []  # (monotonic, line) of the CLI's stdout

    t0 = time.monotonic()
    proc = subprocess.Popen([cluster.cli_path, "submit", spec, "--follow", "-o", "json",
                             "--coordinator", cluster.address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line.strip()))
    reader = threading.Thread(target=read)
    reader.start()
    err = proc.stderr.read()
    proc.wait(timeout=600)
    reader.join()
    if proc.returncode != 0:
        raise RunFailed(f"submit failed ({proc.returncode}): {err.strip()}")
    job_id = lines[0][1]
    t_id = lines[0][0]
    t_reported = None
    record = None
    for t, line in lines[1:]:
        record = json.loads(line)
        if t_reported is None and int(record.get("step", 0)) >= 0:
            t_reported = t
    if record.get("state") != "JOB_STATE_SUCCEEDED":
        raise RunFailed(f"{job_id} did not succeed: {record.get('message', '')}")
    t_accepted = int(record["submitted_unix_ms"]) / 1e3 - offset
    assigned = [t for t, _, m in cluster.lines_matching(r"running rank (\d+) of (\S+)", t0)
                if m.group(2) == job_id]
    if len(assigned) != STAGES:
        raise SystemExit(f"{job_id}: {len(assigned)} assignment lines in the worker logs")
    starts, step0 = [], []
    for rank in range(STAGES):
        with open(os.path.join(weights, f"stage{rank}.json")) as f:
            stats = json.load(f)
        starts.append(min(r[2] for r in stats["records"]))
        step0.append(stats["steps"][0][1])
    return {"accepted": t_accepted - t0, "id": t_id - t0, "assigned": max(assigned) - t0,
            "started": max(starts) - t0, "step 0": max(step0) - t0,
            "reported": t_reported - t0}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build-bench", help="build folder with the daemons")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps of each job")
    args = parser.parse_args()

    runs = []
    cli_start = []
    failures = []  # jobs that failed and were run again
    with LocalCluster(args.build, STAGES) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.wait_for_idle_workers(STAGES)
        for repeat in range(args.repeats):
            t = time.monotonic()
            subprocess.run([cluster.cli_path, "--version"], stdout=subprocess.DEVNULL,
                           check=True)
            cli_start.append(time.monotonic() - t)
            cluster.wait_for_idle_workers(STAGES)
            time.sleep(0.5)  # let the previous job's stage threads wind down
            for attempt in range(3):
                try:
                    with tempfile.TemporaryDirectory(dir=tmp) as run_tmp:
                        r = one_job(cluster, run_tmp, args.steps)
                    break
                except RunFailed as e:
                    failures.append(str(e))
                    print(f"    failed (attempt {attempt + 1} of 3): {e}", file=sys.stderr)
                    cluster.wait_for_idle_workers(STAGES)
            else:
                raise SystemExit("three jobs in a row failed")
            runs.append(r)
            print(f"[{repeat + 1}/{args.repeats}] " +
                  ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in r.items()), file=sys.stderr)

    segments = [
        (None, "accepted",
         "CLI process start, YAML, SubmitJob until the coordinator stored the job"),
        ("accepted", "id", "SubmitJob reply reaches the CLI (job id printed)"),
        ("accepted", "assigned",
         "coordinator -> AssignStage on every worker, stage threads started"),
        ("assigned", "started", "plan (model, data) + Gloo rendezvous + stage build, every rank"),
        ("started", "step 0", "the first step, every rank"),
        ("step 0", "reported", "step reports -> coordinator -> job record streamed to the CLI"),
    ]
    print("| from | to | what | median ms | min..max ms |")
    print("|---|---|---|---|---|")
    for start, end, what in segments:
        seg = [r[end] - (r[start] if start else 0.0) for r in runs]
        print(f"| {start or 't0 (submit started)'} | {end} | {what} | "
              f"{statistics.median(seg) * 1e3:.0f} | "
              f"{min(seg) * 1e3:.0f}..{max(seg) * 1e3:.0f} |")
    total = [r["reported"] for r in runs]
    print(f"| **t0** | **reported** | **submit to first finished step, as the CLI sees it** | "
          f"**{statistics.median(total) * 1e3:.0f}** | "
          f"{min(total) * 1e3:.0f}..{max(total) * 1e3:.0f} |")
    print(f"\n4 stages x 1 replica (default GPT, 2bw, m = 8, b = 8), coordinator + 4 idle "
          f"workers already running; medians over {args.repeats} jobs. For reference, "
          f"`pipetrain --version` (CLI process start) takes "
          f"{statistics.median(cli_start) * 1e3:.0f} ms (median).")
    for failure in failures:
        print(f"\nA job failed and was run again: {failure}")


if __name__ == "__main__":
    main()
