#!/usr/bin/python3
"""Memory per rank: each stage process holds only its own layers.

Runs a GPT of about 110M parameters (d_model 768, 12 heads, 12 blocks, sequence 128,
vocabulary 16384) as one process per stage (`pipetrain-run --launch processes`) for
p in {1, 2, 4} under 2BW and 1F1B (AdamW, float32, m = 4 micro-batches of 2), and reads each
stage's measured resident high-water mark (`peak_memory_bytes` in the JSON summary: VmHWM of
the stage's process) and the bytes of its own parameters (`parameter_bytes`).

For every rank it prints:
  above idle   its peak minus the peak of an idle process of the same binary (the libraries
               loaded, nothing built: `pipetrain-run --help`)
  need         what its own layers need, from the schedule:
                 parameters x (versions + gradients per version + AdamW's 2 moments)
                   (1F1B: 1 version; 2BW: 2 versions, each with its gradient)
               + peak stashed micro-batches x activation bytes its layers keep per
                 micro-batch (what autograd saves in our GPT block: 19 b·T·d floats —
                 16 saved by its ops, 3 contiguous copies of q, k and v that matmul makes —
                 plus b·h·T² for the attention probabilities; embedding b·T·d; final norm
                 b·T·d; LM head b·T·d plus 2 b·T·V for the logits and their softmax)
               + the stage's input and output of each stashed micro-batch
               + one transient copy of its largest parameter tensor (a new gradient before
                 it is added to the accumulated one; AdamW's denominator)
  ratio        above idle / need (aim: <= 1.25)
and per run the sum of `above idle` over its ranks, with the ratio of that sum at p to the
p = 1 run (aim: <= 1.25 at p = 4).

The need is a lower bound by construction (it counts tensors the math requires, not the
allocator's slack, the data set, the transport's buffers or the process's own heap), so a
ratio near 1 means little beyond the layers' own state is resident.

Run:  /usr/bin/python3 bench/memory_per_rank.py [build/run/pipetrain-run] [--steps 3]
About 6 minutes on 2 cores. Markdown to stdout, progress to stderr. Standard library only.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

D, HEADS, BLOCKS, T, V = 768, 12, 12, 128, 16384
M, B = 4, 2
FLOAT = 4  # float32 bytes
MODEL = ["--d-model", str(D), "--n-heads", str(HEADS), "--n-layers", str(BLOCKS),
         "--seq-len", str(T), "--vocab", str(V), "--microbatches", str(M),
         "--microbatch-size", str(B), "--optimizer", "adamw", "--lr", "1e-4"]


def idle_peak(binary):
    """VmHWM of the binary started and stopped with nothing built (its libraries loaded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([binary, "--help"], stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if after <= before:
        sys.exit("could not measure the idle process (ru_maxrss did not grow)")
    return after * 1024  # KiB


def layer_activation_bytes(first, last):
    """Bytes autograd keeps per micro-batch for global layers [first, last)."""
    btd = B * T * D
    total = 0
    for i in range(first, last):
        if i == 0:
            total += btd  # embedding output (ids are small)
        elif i <= BLOCKS:
            total += 19 * btd + B * HEADS * T * T
        elif i == BLOCKS + 1:
            total += btd  # final norm's input
        else:
            total += btd + 2 * B * T * V  # LM head input, logits, log-softmax
    return total * FLOAT


def largest_tensor_bytes(first, last):
    """The largest parameter tensor among global layers [first, last)."""
    largest = 0
    for i in range(first, last):
        if i == 0 or i == BLOCKS + 2:
            largest = max(largest, V * D)  # token embedding, LM head
        elif i <= BLOCKS:
            largest = max(largest, 4 * D * D)  # the MLP's weights
    return largest * FLOAT


def need_bytes(stage, schedule):
    versions = 2 if schedule == "2bw" else 1
    params = stage["parameter_bytes"]
    state = params * (2 * versions + 2)  # each version with its gradient, AdamW's 2 moments
    first, last = stage["layers"]
    per_mb = layer_activation_bytes(first, last) + 2 * B * T * D * FLOAT  # + input and output
    return (state + stage["peak_stashed_microbatches"] * per_mb +
            largest_tensor_bytes(first, last))


def run(binary, schedule, stages, steps):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        cmd = [binary, "--quiet", "--launch", "processes", "--schedule", schedule,
               "--stages", str(stages), "--steps", str(steps), "--summary", summary,
               "--threads-per-stage", "1"] + MODEL
        print(f"running: {' '.join(cmd)}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=1800)
        if done.returncode != 0:
            sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr}")
        with open(summary) as f:
            return json.load(f)


def mib(n):
    return f"{n / 2**20:,.0f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?", default="build/run/pipetrain-run")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    idle = idle_peak(args.binary)
    print(f"idle process of {os.path.basename(args.binary)}: {mib(idle)} MiB peak resident\n")
    print("| schedule | p | stage | layers | params MiB | stashed | peak MiB | above idle MiB "
          "| need MiB | above idle / need |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    sums = {}
    for schedule in ["2bw", "1f1b"]:
        for p in [1, 2, 4]:
            report = run(args.binary, schedule, p, args.steps)
            total = 0
            for s in report["per_stage"]:
                above = s["peak_memory_bytes"] - idle
                need = need_bytes(s, schedule)
                total += above
                print(f"| {schedule} | {p} | {s['stage']} | {s['layers'][0]}:{s['layers'][1]} "
                      f"| {mib(s['parameter_bytes'])} | {s['peak_stashed_microbatches']} "
                      f"| {mib(s['peak_memory_bytes'])} | {mib(above)} | {mib(need)} "
                      f"| {above / need:.2f} |", flush=True)
            sums[(schedule, p)] = (total, report["model"])
    print("\n| schedule | p | sum above idle MiB | sum / p=1 |")
    print("|---|---|---|---|")
    for (schedule, p), (total, _) in sums.items():
        base = sums[(schedule, 1)][0]
        print(f"| {schedule} | {p} | {mib(total)} | {total / base:.2f} |")
    print(f"\nmodel: {next(iter(sums.values()))[1]}")


if __name__ == "__main__":
    main()
