#!/usr/bin/python3
"""Step time of a job under the daemons vs. the same job without them.

Starts a pipetrain-coordinator (fresh SQLite file, loopback, port 0) and --workers
pipetrain-worker processes, then for each layout (stages p x replicas w) runs the same job
spec both ways, interleaved (which side goes first alternates between repeats):
  daemons    `pipetrain submit SPEC --follow -o json`: the coordinator assigns one rank per
             worker; every worker runs its stage over the Gloo data plane and reports each
             step to the coordinator.
  processes  `pipetrain run SPEC --launch processes -q --summary F`: one process per rank,
             started by the CLI, over the same Gloo data plane; no daemon involved.
The job: the default GPT (d_model 64, 4 blocks), schedule 2bw, m = 8, b = 8, --steps steps,
one intra-op thread per rank.

Two step times per run, each with the same definition on both sides:
  mean    (end of the last step - end of step 0) / (steps - 1) on rank 0, which is what
          tokens_per_s means on both sides. Daemons: from the coordinator's job record
          (`pipetrain status -o json`, the last record --follow prints): tokens per step /
          tokens_per_s, where the coordinator computes tokens_per_s from rank 0's step
          reports (end_s of the step, worker monotonic clock). The job record has no
          median. Processes: tokens per step / tokens_per_s of the summary.
  median  median of rank 0's step-to-step times after step 0. Processes: step_time_s of the
          summary. Daemons: the same median over the per-step end times the worker writes to
          weights_dir/stage0.json (the spec's weights_dir, set on the daemon side only, since
          `pipetrain run` does not take that key).
Columns are medians over --repeats; "ratio" is daemons / processes (aim: <= 1.02), of the
medians, and also the median of the per-repeat ratios (each daemons run against the
processes run next to it).
Markdown on stdout, progress on stderr. Standard library only.

Run:  /usr/bin/python3 bench/control_plane_overhead.py [--build build-bench]
          [--repeats 4] [--steps 40] [--layouts p2w1,p4w1]
About 2 minutes with the defaults on 2 cores.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

SPEC = """model: {{name: gpt, d_model: 64, n_heads: 4, n_layers: 4}}
data: {{kind: synthetic, vocab: 64, seq_len: {seq_len}}}
schedule: 2bw
stages: {p}
replicas: {w}
microbatches: {m}
microbatch_size: {b}
steps: {steps}
threads_per_stage: 1
optimizer: {{name: adamw, lr: 3.0e-3}}
"""


class RunFailed(Exception):
    pass


def parse_layout(text):
    m = re.fullmatch(r"p(\d+)w(\d+)", text)
    if not m:
        raise SystemExit(f"--layouts: expected pPwW (e.g. p2w1), got '{text}'")
    return int(m.group(1)), int(m.group(2))


def run_processes(cluster, spec_path, tmp):
    summary = os.path.join(tmp, "summary.json")
    cmd = [cluster.cli_path, "run", spec_path, "--launch", "processes", "-q",
           "--summary", summary]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RunFailed(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
    with open(summary) as f:
        s = json.load(f)
    rows = s["replicas"] * s["microbatches"] * s["microbatch_size"]
    return {"median": s["step_time_s"], "mean": rows / s["samples_per_s"]}


def run_daemons(cluster, spec_text, tmp, tokens_per_step):
    weights = os.path.join(tmp, "weights")
    spec_path = os.path.join(tmp, "daemons.yaml")
    with open(spec_path, "w") as f:
        f.write(spec_text + f"weights_dir: {weights}\n")
    done = cluster.cli(["submit", spec_path, "--follow", "-o", "json"], check=False)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    job = records[-1] if records else {}
    if done.returncode != 0 or job.get("state") != "JOB_STATE_SUCCEEDED":
        raise RunFailed(f"job did not succeed ({done.returncode}): {job.get('message', '')}"
                        f"{done.stderr}")
    # The final record again, as `pipetrain status -o json` gives it.
    job = json.loads(cluster.cli(["status", job["id"], "-o", "json"]).stdout)
    with open(os.path.join(weights, "stage0.json")) as f:
        ends = [s[1] for s in json.load(f)["steps"]]
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    return {"median": statistics.median(gaps), "mean": tokens_per_step / job["tokens_per_s"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build-bench", help="build folder with the daemons")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layouts", default="p2w1,p4w1",
                        help="comma-separated pPwW: p stages x w replicas")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=3,
                        help="tries per run before giving up (failed runs are listed)")
    args = parser.parse_args()
    layouts = [parse_layout(t) for t in args.layouts.split(",")]
    seq_len = 32
    workers = max(p * w for p, w in layouts)

    results = {}  # (layout, side) -> [dict]
    failures = []  # runs that failed and were run again
    started = time.monotonic()
    with LocalCluster(args.build, workers) as cluster, \
            tempfile.TemporaryDirectory() as tmp:
        cluster.wait_for_idle_workers(workers)
        print(f"coordinator at {cluster.address}, {workers} workers idle", file=sys.stderr)
        for repeat in range(args.repeats):
            for p, w in layouts:
                spec = SPEC.format(p=p, w=w, m=args.microbatches, b=args.microbatch_size,
                                   steps=args.steps, seq_len=seq_len)
                spec_path = os.path.join(tmp, "processes.yaml")
                with open(spec_path, "w") as f:
                    f.write(spec)
                tokens_per_step = w * args.microbatches * args.microbatch_size * seq_len
                sides = ["daemons", "processes"]
                if repeat % 2:
                    sides.reverse()
                for side in sides:
                    print(f"[{repeat + 1}/{args.repeats}] p{p}w{w} {side}", file=sys.stderr)
                    for attempt in range(args.attempts):
                        try:
                            with tempfile.TemporaryDirectory(dir=tmp) as run_tmp:
                                if side == "daemons":
                                    cluster.wait_for_idle_workers(p * w)
                                    r = run_daemons(cluster, spec, run_tmp, tokens_per_step)
                                else:
                                    r = run_processes(cluster, spec_path, run_tmp)
                            break
                        except RunFailed as e:
                            failures.append(f"p{p}w{w} {side}: {str(e).strip().splitlines()[-1]}")
                            print(f"    run failed, attempt {attempt + 1} of {args.attempts}: "
                                  f"{e}", file=sys.stderr)
                    else:
                        raise SystemExit(f"p{p}w{w} {side} failed {args.attempts} times")
                    print(f"    mean {r['mean'] * 1e3:.2f} ms, median {r['median'] * 1e3:.2f} ms",
                          file=sys.stderr)
                    results.setdefault((p, w, side), []).append(r)

    print("| layout | processes mean ms | daemons mean ms | ratio (mean) "
          "| processes median ms | daemons median ms | ratio (median) "
          "| median of paired ratios (mean) | per-repeat ratios (mean) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p, w in layouts:
        d, r = results[(p, w, "daemons")], results[(p, w, "processes")]
        md = statistics.median(x["mean"] for x in d)
        mr = statistics.median(x["mean"] for x in r)
        dd = statistics.median(x["median"] for x in d)
        dr = statistics.median(x["median"] for x in r)
        paired = [a["mean"] / b["mean"] for a, b in zip(d, r)]
        per = ", ".join(f"{x:.3f}" for x in paired)
        print(f"| p{p}w{w} | {mr * 1e3:.2f} | {md * 1e3:.2f} | **{md / mr:.3f}** | "
              f"{dr * 1e3:.2f} | {dd * 1e3:.2f} | {dd / dr:.3f} | "
              f"{statistics.median(paired):.3f} | {per} |")
    print(f"\nDefault GPT, 2bw, m = {args.microbatches}, b = {args.microbatch_size}, "
          f"{args.steps} steps, one intra-op thread per rank; medians over {args.repeats} "
          f"interleaved repeats ({time.monotonic() - started:.0f} s in all).")
    for failure in failures:
        print(f"\nA run failed and was run again: {failure}")


if __name__ == "__main__":
    main()
