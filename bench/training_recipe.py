#!/usr/bin/python3
"""What gradient clipping and evaluation on held-out data cost a pipeline, side by side.

For each schedule (1f1b, 2bw), runs one job as processes (4 stages) four ways in turn each
round -- plain, with --clip-grad-norm, evaluating before every step (--eval-every 1), with
both -- and rests between runs. Clipping: every rank exchanges its part of the norm with
every other at each update, which under 2bw (no flush) makes every stage's update wait for
stage 0's. Both show in the median step time: reported with the median over rounds of the
paired ratio to the plain run and, for evaluation, of the paired difference (the cost of one
evaluation of --eval-batches micro-batches per replica). Every run holds out the same split,
so the training is the same in all four.

Run:  /usr/bin/python3 bench/training_recipe.py build/client/pipetrain [--rounds 5]
          [--steps 30] [--rest 2]
Standard library only; about 7 minutes with the defaults on 2 cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

JOB = ["--launch", "processes", "--stages", "4", "--microbatches", "8", "--d-model", "64",
       "--n-layers", "6", "--n-heads", "4", "--seq-len", "32", "--eval-split", "0.05",
       "--eval-batches", "4"]


def run(binary, args):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        subprocess.run([binary, "run", "-q", "--summary", summary] + args, check=True,
                       timeout=900)
        with open(summary) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipetrain")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rest", type=float, default=2.0, help="seconds between runs")
    opts = parser.parse_args()
    variants = {
        "plain": [],
        "clip": ["--clip-grad-norm", "1.0"],
        "eval": ["--eval-every", "1"],
        "clip+eval": ["--clip-grad-norm", "1.0", "--eval-every", "1"],
    }
    print("| schedule | variant | step ms (median) | step / plain (paired) | "
          "ms per evaluation (paired) |")
    print("|---|---|---|---|---|")
    for schedule in ("1f1b", "2bw"):
        results = {name: [] for name in variants}
        for _ in range(opts.rounds):
            for name, extra in variants.items():
                args = JOB + ["--schedule", schedule, "--steps", str(opts.steps)] + extra
                results[name].append(run(opts.pipetrain, args))
                time.sleep(opts.rest)
        plain = results["plain"]
        for name in variants:
            runs = results[name]
            step = statistics.median(r["step_time_s"] for r in runs)
            ratio = statistics.median(r["step_time_s"] / p["step_time_s"]
                                      for r, p in zip(runs, plain))
            per_eval = "-"
            if name == "eval":
                per_eval = "%.1f" % statistics.median(
                    (r["step_time_s"] - p["step_time_s"]) * 1e3 for r, p in zip(runs, plain))
            print(f"| {schedule} | {name} | {step * 1e3:.1f} | {ratio:.3f} | {per_eval} |")
    print(f"\n4 stages as processes, {opts.steps} steps, evaluation (4 micro-batches of 8) "
          f"before every step, medians of {opts.rounds} rounds.")


if __name__ == "__main__":
    main()
