#!/usr/bin/python3
"""Step time of two pipetrain binaries side by side (e.g. before and after a change).

For each layout, runs `BIN run --launch processes --steps N -q --summary F` with binary A
and binary B, interleaved (A, B, A, B, ...) for --repeats rounds so that machine noise hits
both, and prints the median step_time_s of each and B/A. The job is the default GPT unless
extra arguments follow `--`.

Run:  /usr/bin/python3 bench/ab_step_time.py OLD/pipetrain NEW/pipetrain [--repeats 3]
          [--steps 30] [--launch processes] [-- extra run flags]
Build the old binary from an earlier commit in a second build folder (git worktree).
Standard library only; about 90 s with the defaults on 2 cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

LAYOUTS = {
    "p4w1": ["--stages", "4"],
    "p2w2": ["--stages", "2", "--replicas", "2"],
    "p4w2": ["--stages", "4", "--replicas", "2"],
}


def step_time(binary, args):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        subprocess.run([binary, "run", "-q", "--summary", summary] + args, check=True,
                       timeout=600)
        with open(summary) as f:
            return json.load(f)["step_time_s"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--launch", default="processes", choices=["threads", "processes"])
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="comma-separated subset of " + ", ".join(LAYOUTS))
    parser.add_argument("extra", nargs="*")
    opts = parser.parse_args()
    layouts = {name: LAYOUTS[name] for name in opts.layouts.split(",")}
    times = {}
    for _ in range(opts.repeats):
        for name, layout in layouts.items():
            for side, binary in enumerate((opts.a, opts.b)):
                args = ["--launch", opts.launch, "--steps", str(opts.steps)] + layout + opts.extra
                times.setdefault((name, side), []).append(step_time(binary, args))
    print("| layout | A ms | B ms | B / A |")
    print("|---|---|---|---|")
    for name in layouts:
        a = statistics.median(times[(name, 0)])
        b = statistics.median(times[(name, 1)])
        print(f"| {name} | {a * 1e3:.1f} | {b * 1e3:.1f} | {b / a:.3f} |")
    print(f"\n--launch {opts.launch}, {opts.steps} steps, medians of {opts.repeats} interleaved runs.")


if __name__ == "__main__":
    main()
