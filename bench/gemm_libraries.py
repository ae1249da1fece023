#!/usr/bin/python3
"""The fast path's GEMM libraries side by side: one pipetrain stage's step time under each.

runtime/model/dense_kernels.h runs the built-in models' float32 products on oneDNN's or
OpenBLAS's sgemm, or leaves them to LibTorch's operators (PIPETRAIN_GEMM=onednn|openblas|aten;
the default is chosen by the CPU). This runs the GPT of bench/peers.py on one stage, one
intra-op thread, under each library in turn (onednn, openblas, aten, onednn, ...) for --rounds
rounds with a rest between runs, and prints each run's step_time_s, the median per library,
and the medians of the paired ratios of each library to the default.

Run:  /usr/bin/python3 bench/gemm_libraries.py [build/run/pipetrain-run] [--rounds 6]
Standard library only; about 30 s per run, 10 minutes with the defaults on 2 cores.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

LIBRARIES = ("onednn", "openblas", "aten")


def step_time(args, library):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        env = dict(os.environ, PIPETRAIN_GEMM=library, OPENBLAS_NUM_THREADS="1",
                   OMP_NUM_THREADS="1")
        subprocess.run([args.binary, "-q", "--summary", summary, "--steps", str(args.steps),
                        "--threads-per-stage", "1", "--seed", "1", "--d-model", "256",
                        "--n-heads", "4", "--n-layers", "8", "--seq-len", "64", "--vocab", "256",
                        "--launch", "threads", "--stages", "1", "--schedule", "1f1b",
                        "--microbatches", "1", "--microbatch-size", "64"],
                       env=env, check=True, timeout=900, stdout=subprocess.DEVNULL)
        with open(summary) as f:
            return json.load(f)["step_time_s"]


def cpu_name():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    name = next((l.split(":", 1)[1].strip() for l in info.splitlines()
                 if l.startswith("model name")), "unknown CPU")
    return name + (", AVX-512" if " avx512f" in info else ", no AVX-512")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", nargs="?", default="build/run/pipetrain-run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8, help="steps per run (the first unmeasured)")
    parser.add_argument("--rest", type=float, default=3.0, help="seconds between runs")
    args = parser.parse_args()
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"{args.binary}: not an executable (build it: scripts/build.sh --main)")
    times = {lib: [] for lib in LIBRARIES}
    for r in range(args.rounds):
        for lib in LIBRARIES:
            times[lib].append(step_time(args, lib))
            print(f"round {r + 1}: {lib:8s} {times[lib][-1] * 1000:.0f} ms", flush=True)
            time.sleep(args.rest)
    print(f"\n{cpu_name()}; GPT d_model 256, 8 blocks, sequence 64, 64 sequences per step, "
          f"one thread; {args.rounds} rounds\n")
    print("| library | median step ms | median of paired ratios to onednn | to aten |")
    print("|---|---|---|---|")
    for lib in LIBRARIES:
        to = {b: statistics.median(x / y for x, y in zip(times[lib], times[b]))
              for b in ("onednn", "aten")}
        print(f"| {lib} | {statistics.median(times[lib]) * 1000:.0f} | {to['onednn']:.3f} | "
              f"{to['aten']:.3f} |")


if __name__ == "__main__":
    main()
