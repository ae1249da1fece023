#!/usr/bin/python3
"""Data x pipeline parallelism: Hippie's hidden AllReduce, and processes vs. threads.

Table 1, exposed AllReduce with and without the Hippie schedule. For p in {2, 4} stages and
w = 2 replicas, with the stages as threads of one process and as processes over Gloo, runs
the same 1F1B job (Hippie's last-stage schedule; GPT with d_model 128) with
--overlap-allreduce false and true, and reads from its JSON summary:
  exposed      exposed_allreduce_s: per step, how long gradient AllReduce of any stage ran
               past the end of stage 0's last backward (the latest over the replicas);
               median over steps after the first.
  not hidden   exposed_allreduce_s of the run without overlap: there stage 0 starts
               averaging its gradients only after its last backward, so all of its
               AllReduce is exposed; this is "the non-overlapped AllReduce time".
  ratio        exposed with Hippie / not hidden (aim: <= 0.25).
  step         step_time_s of each run.

Table 2, step time of the multi-process mode vs. the in-process mode for the same job (the
default GPT, 2bw), p in {2, 4}, w in {1, 2}.

Every configuration runs --repeats times, interleaved (all configurations once, then
again), so that machine noise hits both sides of every ratio; columns are medians over the
repeats. Progress goes to stderr, markdown to stdout. Standard library only.

Run:  /usr/bin/python3 bench/data_parallel.py [build-bench/client/pipetrain]
          [--steps 30] [--repeats 3]
(Default binary: build/client/pipetrain.) About 6 minutes on 2 cores with --repeats 3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HIPPIE_MODEL = ["--d-model", "128", "--schedule", "1f1b"]


def run(binary, args, steps):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        cmd = [binary, "run", "--quiet", "--steps", str(steps), "--summary", summary] + args
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=600)
        if done.returncode != 0:
            sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
        with open(summary) as f:
            return json.load(f)


def median_of(results, key):
    return statistics.median(r[key] for r in results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?", default="build/client/pipetrain")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    hippie = {}  # (launch, p, overlap) -> summaries
    modes = {}   # (launch, p, w) -> summaries
    hippie_cases = [(launch, p, overlap) for p in (2, 4) for launch in ("threads", "processes")
                    for overlap in ("false", "true")]
    mode_cases = [(launch, p, w) for p in (2, 4) for w in (1, 2)
                  for launch in ("threads", "processes")]
    for repeat in range(args.repeats):
        for launch, p, overlap in hippie_cases:
            print(f"[{repeat + 1}/{args.repeats}] hippie {launch} p={p} w=2 overlap={overlap}",
                  file=sys.stderr)
            hippie.setdefault((launch, p, overlap), []).append(run(
                args.binary, HIPPIE_MODEL + ["--launch", launch, "--stages", str(p),
                                             "--replicas", "2", "--threads-per-stage", "1",
                                             f"--overlap-allreduce={overlap}"], args.steps))
        for launch, p, w in mode_cases:
            print(f"[{repeat + 1}/{args.repeats}] step time {launch} p={p} w={w}",
                  file=sys.stderr)
            modes.setdefault((launch, p, w), []).append(run(
                args.binary, ["--launch", launch, "--stages", str(p), "--replicas", str(w),
                              "--threads-per-stage", "1"], args.steps))

    print("#### Exposed gradient AllReduce, w = 2 (bench/data_parallel.py)\n")
    print("| stages as | p | not hidden (overlap off) ms | exposed with Hippie ms | ratio "
          "| step off ms | step on ms |")
    print("|---|---|---|---|---|---|---|")
    for p in (2, 4):
        for launch in ("threads", "processes"):
            off, on = hippie[(launch, p, "false")], hippie[(launch, p, "true")]
            not_hidden = median_of(off, "exposed_allreduce_s")
            exposed = median_of(on, "exposed_allreduce_s")
            ratio = exposed / not_hidden if not_hidden > 0 else float("nan")
            print(f"| {launch} | {p} | {not_hidden * 1e3:.2f} | {exposed * 1e3:.2f} | "
                  f"{ratio:.2f} | {median_of(off, 'step_time_s') * 1e3:.1f} | "
                  f"{median_of(on, 'step_time_s') * 1e3:.1f} |")
    print(f"\nGPT d_model 128, 1f1b, m = 8, b = 8, {args.steps} steps, one intra-op thread "
          f"per stage; medians over {args.repeats} interleaved repeats.\n")

    print("#### Step time: stages as processes vs. threads (bench/data_parallel.py)\n")
    print("| p | w | threads ms | processes ms | processes / threads |")
    print("|---|---|---|---|---|")
    for p in (2, 4):
        for w in (1, 2):
            threads = median_of(modes[("threads", p, w)], "step_time_s")
            processes = median_of(modes[("processes", p, w)], "step_time_s")
            print(f"| {p} | {w} | {threads * 1e3:.1f} | {processes * 1e3:.1f} | "
                  f"{processes / threads:.2f} |")
    print(f"\nThe default GPT (d_model 64, 2bw, m = 8, b = 8), {args.steps} steps, one "
          f"intra-op thread per stage; medians over {args.repeats} interleaved repeats.")


if __name__ == "__main__":
    main()
