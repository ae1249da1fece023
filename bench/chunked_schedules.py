#!/usr/bin/python3
"""Schedules with several stages a rank against 1F1B: measured step time, prediction, ratios.

Runs one job (a GPT whose stages take milliseconds: d_model 256, 4 blocks, 4 heads,
sequences of 64, micro-batches of 4 rows) as `pipetrain run --launch threads` on P ranks (P =
this machine's cores by default), M micro-batches a step, one intra-op thread a rank, under
each schedule:
  1f1b          one model stage a rank (the baseline)
  zb1p          ZB-H1: one stage a rank, its backward split into I and W
  interleaved   2 model stages a rank (virtual pipeline)
  zb1p-v2       interleaved zero-bubble, 2 model stages a rank
  zbv           ZB-V: 2 stages a rank in a V
  dualpipev     DualPipeV: 2 stages a rank in a V (its F-with-B pairs one after the other)
The machine's speed swings under sustained load, so each schedule is measured in pairs with
1F1B: in every round, each schedule (in an order rotated by one each round) runs right
before or right after a 1F1B run (alternating), with a rest between runs. Per run it reads
the summary: step_time_s (median over steps after the first) and ideal_step_time_s (the
schedule simulated with this run's own measured mean time of each kind of action: the
prediction). Before the rounds, the planner's own prediction of each schedule from the
model's profile (`pipetrain plan --predict`, the profile measured or cached first). Prints a
markdown table: per schedule the median step and prediction over its runs, and the median
(and range) over rounds of the ratio of its step to its paired 1F1B run's, beside the
planner's predicted ratio. Standard library only.

Run:  /usr/bin/python3 bench/chunked_schedules.py [build/client/pipetrain]
          [--rounds 6] [--steps 20] [--stages P] [--microbatches 8]
About 1.5 minutes a round at the defaults on 2 cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# name -> (schedule, virtual stages)
CONTENDERS = {
    "1f1b": ("1f1b", 0),
    "zb1p": ("zb1p", 1),
    "interleaved": ("interleaved", 2),
    "zb1p-v2": ("zb1p", 2),
    "zbv": ("zbv", 2),
    "dualpipev": ("dualpipev", 2),
}


def job_flags(args, name):
    schedule, virtual = CONTENDERS[name]
    flags = ["-q", "--schedule", schedule,
             "--stages", str(args.stages), "--microbatches", str(args.microbatches),
             "--microbatch-size", str(args.microbatch_size), "--steps", str(args.steps),
             "--d-model", str(args.d_model), "--n-heads", "4",
             "--n-layers", str(args.n_layers), "--seq-len", str(args.seq_len)]
    if virtual:
        flags += ["--virtual-stages", str(virtual)]
    return flags


def planner_prediction(args, name):
    cmd = [args.binary, "plan", "--predict", "-o", "json"] + job_flags(args, name)
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr}")
    return json.loads(result.stdout)["predicted_step_time_s"]


def run_once(args, name, summary_path):
    cmd = [args.binary, "run", "--launch", "threads", "--threads-per-stage", "1",
           "--summary", summary_path] + job_flags(args, name)
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr}")
    with open(summary_path) as f:
        summary = json.load(f)
    return summary["step_time_s"], summary["ideal_step_time_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?", default="build/client/pipetrain")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--stages", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--rest", type=float, default=2.0, help="seconds between runs")
    parser.add_argument("--only", nargs="*", default=list(CONTENDERS),
                        help="contenders (1f1b always runs)")
    args = parser.parse_args()
    names = ["1f1b"] + [n for n in args.only if n != "1f1b"]
    steps = {n: [] for n in names}
    ideals = {n: [] for n in names}
    ratios = {n: [1.0] for n in names[:1]}
    ratios.update({n: [] for n in names[1:]})
    others = names[1:]
    planned = {n: planner_prediction(args, n) for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        for r in range(args.rounds):
            k = r % len(others)
            for i, name in enumerate(others[k:] + others[:k]):
                pair = ["1f1b", name] if (r + i) % 2 == 0 else [name, "1f1b"]
                measured = {}
                for contender in pair:
                    step, ideal = run_once(args, contender, summary)
                    measured[contender] = step
                    steps[contender].append(step)
                    ideals[contender].append(ideal)
                    print(f"round {r}: {contender}: step {step * 1e3:.1f} ms, predicted "
                          f"{ideal * 1e3:.1f} ms", file=sys.stderr, flush=True)
                    time.sleep(args.rest)
                ratios[name].append(measured[name] / measured["1f1b"])
    print(f"\n{args.stages} ranks, {args.microbatches} micro-batches of {args.microbatch_size}, "
          f"GPT d_model {args.d_model}, {args.n_layers} blocks, seq {args.seq_len}; "
          f"{args.rounds} rounds of {args.steps} steps\n")
    print("| schedule | step (median) | predicted (median) | step / paired 1F1B's (median) "
          "| range | planner's step / its 1F1B's |")
    print("|---|---|---|---|---|---|")
    for name in names:
        print(f"| {name} | {statistics.median(steps[name]) * 1e3:.1f} ms | "
              f"{statistics.median(ideals[name]) * 1e3:.1f} ms | "
              f"{statistics.median(ratios[name]):.3f} | "
              f"{min(ratios[name]):.3f}-{max(ratios[name]):.3f} | "
              f"{planned[name] / planned['1f1b']:.3f} ({planned[name] * 1e3:.1f} ms) |")


if __name__ == "__main__":
    main()
