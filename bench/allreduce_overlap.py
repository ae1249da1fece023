#!/usr/bin/python3
"""Hippie's gradient AllReduce overlap against averaging after the backward, by bucket size.

A model as 1 stage x 2 data-parallel replicas, one process and one intra-op thread each,
run with stage 0's AllReduce (a) after its last backward, (b) overlapped with that backward
in 256 KiB buckets, (c) overlapped in 4 MiB buckets (the default), interleaved for --rounds
rounds. Per setting: step time (the median between step ends, after the first step) and
the exposed AllReduce per step (the part no backward hides: pipetrain-run's
exposed_allreduce_s) and the whole AllReduce per step (allreduce_s), medians over rounds.
The model: examples/large/gpt2_small.yaml (GPT-2 small's shape, 85M parameters, 8
sequences of 128 per replica per step) by default; --small uses a 4.8M-parameter GPT.
Prints a markdown table; progress on stderr. Standard library only.

Run:  /usr/bin/python3 bench/allreduce_overlap.py [--build build] [--steps 6] [--rounds 2] [--small]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_SMALL = os.path.join(HERE, "..", "examples", "large", "gpt2_small.yaml")

SETTINGS = (
    ("after the backward", ["--overlap-allreduce", "false"]),
    ("overlapped, 256 KiB buckets", ["--overlap-allreduce", "true", "--bucket-kib", "256"]),
    ("overlapped, 4 MiB buckets", ["--overlap-allreduce", "true", "--bucket-kib", "4096"]),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", action="store_true",
                        help="a 4.8M-parameter GPT (d 256, 6 blocks, seq 64) instead")
    args = parser.parse_args()
    runner = os.path.join(args.build, "run", "pipetrain-run")
    if args.small:
        job = ["--d-model", "256", "--n-heads", "4", "--n-layers", "6", "--seq-len", "64",
               "--microbatch-size", "8", "--microbatches", "1"]
    else:
        job = [GPT2_SMALL, "--microbatch-size", "2", "--microbatches", "4"]
    layout = ["--schedule", "1f1b", "--stages", "1", "--replicas", "2", "--threads-per-stage", "1",
              "--steps", str(args.steps)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="allreduce_overlap_")
    results = {name: {"step": [], "exposed": [], "allreduce": []} for name, _ in SETTINGS}
    for r in range(args.rounds):
        for name, flags in SETTINGS:
            summary = os.path.join(tmp, "summary.json")
            cmd = [runner] + job + layout + flags + ["--launch", "processes", "-q", "--summary", summary]
            print(f"round {r + 1}: {name} ...", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr}")
            with open(summary) as f:
                s = json.load(f)
            results[name]["step"].append(s["step_time_s"])
            results[name]["exposed"].append(s.get("exposed_allreduce_s", 0.0))
            results[name]["allreduce"].append(s.get("allreduce_s", 0.0))
            print(f"  step {s['step_time_s'] * 1e3:.1f} ms, exposed AllReduce "
                  f"{s.get('exposed_allreduce_s', 0) * 1e3:.1f} ms of "
                  f"{s.get('allreduce_s', 0) * 1e3:.1f} ms", file=sys.stderr, flush=True)
    base = statistics.median(results[SETTINGS[0][0]]["step"])
    print("| gradient AllReduce | step ms | vs after the backward | exposed AllReduce ms | "
          "whole AllReduce ms | step ms per round |")
    print("|---|---|---|---|---|---|")
    for name, _ in SETTINGS:
        x = results[name]
        step = statistics.median(x["step"])
        print(f"| {name} | {step * 1e3:.1f} | {step / base:.3f} | "
              f"{statistics.median(x['exposed']) * 1e3:.1f} | "
              f"{statistics.median(x['allreduce']) * 1e3:.1f} | "
              f"{', '.join(f'{v * 1e3:.1f}' for v in x['step'])} |")


if __name__ == "__main__":
    main()
