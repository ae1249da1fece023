#!/usr/bin/python3
"""GPT-2 small's shape as stage processes: tokens/s, per-stage peak memory and ME per schedule.

The job of examples/large/gpt2_small.yaml (d_model 768, 12 heads, 12 blocks, byte vocabulary:
85M parameters; sequence 128; 8 micro-batches of 2 per step; AdamW) on 2 processes, one
intra-op thread each, each layout run for --steps steps (the first is warm-up) and, with
--rounds R, R times interleaved:
  data parallelism   1 stage x 2 replicas (the ME reference)
  gpipe, 1f1b, 2bw   2 stages x 1 replica
  hippie             the layout `stages: auto` with the Hippie planner picks for 2 workers
Per layout: step time (median between step ends), tokens/s, the largest stage's peak tensor
bytes (counted at the allocator) and resident high-water mark, and ME = (tokens/s / DP's) /
(peak tensor bytes / DP's). Prints a markdown table; progress on stderr. Standard library.

Run:  /usr/bin/python3 bench/gpt2_small.py [--build build] [--steps 6] [--rounds 1]
About 5 minutes on 2 cores with --steps 5 (profiling the model for the planner once).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "..", "examples", "large", "gpt2_small.yaml")

LAYOUTS = (
    ("data parallelism", ["--schedule", "1f1b", "--stages", "1", "--replicas", "2",
                          "--microbatches", "4"]),
    ("gpipe", ["--schedule", "gpipe", "--stages", "2"]),
    ("1f1b", ["--schedule", "1f1b", "--stages", "2"]),
    ("2bw", ["--schedule", "2bw", "--stages", "2"]),
    ("hippie (planned)", ["--stages", "auto", "--planner", "hippie", "--plan-workers", "2"]),
)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    runner = os.path.join(args.build, "run", "pipetrain-run")
    tmp = tempfile.mkdtemp(prefix="gpt2_small_")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1",
               PIPETRAIN_CACHE_DIR=os.environ.get("PIPETRAIN_CACHE_DIR", os.path.join(tmp, "profiles")))
    results = {name: [] for name, _ in LAYOUTS}
    for r in range(args.rounds):
        for name, flags in LAYOUTS:
            summary = os.path.join(tmp, "summary.json")
            cmd = [runner, JOB, "--launch", "processes", "--steps", str(args.steps),
                   "--threads-per-stage", "1", "-q", "--summary", summary] + flags
            print(f"round {r}: {name} ...", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            if done.returncode != 0:
                sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr}")
            with open(summary) as f:
                s = json.load(f)
            results[name].append(s)
            print(f"  {s['step_time_s']:.2f} s/step, {s['tokens_per_s']:.0f} tok/s, layout "
                  f"{s['partition']} x {s['replicas']}, b={s['microbatch_size']} m={s['microbatches']}, "
                  f"recompute {s['config']['recompute']}", file=sys.stderr, flush=True)

    def summarize(runs):
        step = statistics.median(x["step_time_s"] for x in runs)
        tokens = statistics.median(x["tokens_per_s"] for x in runs)
        tensors = max(st["peak_tensor_bytes"] for st in runs[-1]["per_stage"])
        resident = max(st["peak_memory_bytes"] for st in runs[-1]["per_stage"])
        return step, tokens, tensors, resident, runs[-1]

    dp = summarize(results["data parallelism"])
    print("| layout | stages x replicas | micro-batches | step s | tokens/s | largest stage's peak "
          "tensors MiB | its resident peak MiB | ME vs DP |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in LAYOUTS:
        step, tokens, tensors, resident, last = summarize(results[name])
        me = (tokens / dp[1]) / (tensors / dp[2])
        layout = ",".join(f"{a}:{b}" for a, b in last["partition"])
        print(f"| {name} | {len(last['partition'])} ({layout}) x {last['replicas']} | "
              f"{last['microbatches']} of {last['microbatch_size']}"
              f"{', recompute ' + last['config']['recompute'] if last['config']['recompute'] != 'none' else ''} | "
              f"{step:.2f} | {tokens:.0f} | {tensors / 2**20:.0f} | {resident / 2**20:.0f} | {me:.2f} |")


if __name__ == "__main__":
    main()
