#!/usr/bin/python3
"""The planner's predictions against measured runs: step time and per-stage peak memory.

For each configuration (two GPT sizes and a VGG-16; gpipe, 1f1b and 2bw; p in {1, 2, 4}
stages; w in {1, 2} replicas; with and without recomputation), with the same global batch
per model:
  predicted  `pipetrain plan --predict` of that layout: the model profiled on this machine
             (one intra-op thread, cached), every stage's action list simulated with the
             profiled costs, the Gloo links and the p x w ranks sharing this machine's cores;
  measured   `pipetrain-run --launch processes` of the same job (one process per rank, one
             intra-op thread each): step_time_s (median time between step ends) and every
             stage's peak_tensor_bytes (tensor storage counted at the allocator).
Prints one markdown table (one row per configuration: predicted and measured step time and
the error, the largest per-stage memory error) and the mean and worst step-time errors, in
all and per model.
Standard library only; progress on stderr.

Run:  /usr/bin/python3 bench/plan_accuracy.py [--build build] [--steps 30] [--repeats 1]
The profile cache lives in a temporary directory unless --cache-dir is given. About ten
minutes on 2 cores with the defaults.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# (schedule, stages, replicas, micro-batch size, recompute); m = B / (w b).
LAYOUTS = (
    ("1f1b", 1, 1, 8, "none"),
    ("1f1b", 1, 2, 8, "none"),
    ("gpipe", 2, 1, 4, "none"),
    ("1f1b", 2, 1, 4, "none"),
    ("2bw", 2, 1, 4, "none"),
    ("1f1b", 2, 1, 4, "all"),
    ("1f1b", 2, 2, 4, "none"),
    ("2bw", 4, 1, 4, "none"),
    ("1f1b", 4, 1, 4, "all"),
)

# (name, model flags, global batch, layouts). The small model is the built-in default GPT;
# the VGG is VGG-16 with BatchNorm at a quarter of the paper's widths on 32x32 images.
MODELS = (
    ("gpt-small", [], 32, LAYOUTS),
    ("gpt-d256", ["--d-model", "256", "--n-heads", "4", "--n-layers", "6", "--seq-len", "64"], 16,
     LAYOUTS),
    ("vgg16-w16", ["--model", "vgg", "--hidden-layers", "16", "--hidden", "16", "--image-shape",
                   "3,32,32", "--num-classes", "10"], 32,
     (("1f1b", 1, 1, 8, "none"), ("1f1b", 2, 1, 4, "none"), ("2bw", 2, 1, 4, "none"),
      ("1f1b", 2, 2, 4, "none"), ("1f1b", 4, 1, 4, "all"))),
)


def job_flags(model_flags, batch, schedule, stages, replicas, b, recompute, steps):
    m = batch // (replicas * b)
    return model_flags + [
        "--schedule", schedule, "--stages", str(stages), "--replicas", str(replicas),
        "--microbatch-size", str(b), "--microbatches", str(m), "--recompute", recompute,
        "--steps", str(steps), "--threads-per-stage", "1"]


def run(cmd, env):
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1,
                        help="measured runs per configuration (the median is kept)")
    parser.add_argument("--cache-dir", default="")
    args = parser.parse_args()
    cli = os.path.join(args.build, "client", "pipetrain")
    runner = os.path.join(args.build, "run", "pipetrain-run")
    env = dict(os.environ)
    tmp = tempfile.mkdtemp(prefix="plan_accuracy_")
    env["PIPETRAIN_CACHE_DIR"] = args.cache_dir or os.path.join(tmp, "profiles")

    rows, errors = [], []
    for model, model_flags, batch, layouts in MODELS:
        for schedule, p, w, b, recompute in layouts:
            flags = job_flags(model_flags, batch, schedule, p, w, b, recompute, args.steps)
            label = f"{model} {schedule} p={p} w={w} b={b} m={batch // (w * b)}" + (
                " recompute" if recompute != "none" else "")
            print(f"{label} ...", file=sys.stderr, flush=True)
            predicted = json.loads(run([cli, "plan", "--predict", "-o", "json", "-q",
                                        "--workers", str(p * w)] + flags, env))
            steps, memory = [], None
            for _ in range(args.repeats):
                summary_path = os.path.join(tmp, "summary.json")
                run([runner, "--launch", "processes", "-q", "--summary", summary_path] + flags, env)
                with open(summary_path) as f:
                    summary = json.load(f)
                steps.append(summary["step_time_s"])
                memory = [s["peak_tensor_bytes"] for s in summary["per_stage"]]
            measured = statistics.median(steps)
            pred = predicted["predicted_step_time_s"]
            error = (pred - measured) / measured
            errors.append(abs(error))
            mem_pred = predicted["predicted_peak_memory_bytes"]
            mem_errors = [(mp - mm) / mm for mp, mm in zip(mem_pred, memory) if mm > 0]
            worst_mem = max(mem_errors, key=abs) if mem_errors else 0.0
            rows.append((label, pred * 1e3, measured * 1e3, 100 * error,
                         max(mem_pred) / 2**20, max(memory) / 2**20, 100 * worst_mem))
            print(f"  predicted {pred * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms "
                  f"({100 * error:+.1f}%); memory {[round(x / 2**20, 2) for x in mem_pred]} vs "
                  f"{[round(x / 2**20, 2) for x in memory]} MiB", file=sys.stderr, flush=True)

    print("| configuration | predicted step ms | measured step ms | error | predicted peak MiB "
          "| measured peak MiB | worst stage memory error |")
    print("|---|---|---|---|---|---|---|")
    for label, pred, meas, err, mp, mm, merr in rows:
        print(f"| {label} | {pred:.1f} | {meas:.1f} | {err:+.1f}% | {mp:.2f} | {mm:.2f} | {merr:+.1f}% |")
    print(f"\n{len(rows)} configurations: mean |step-time error| {100 * statistics.mean(errors):.1f}%, "
          f"worst {100 * max(errors):.1f}%")
    for model, _, _, _ in MODELS:
        mine = [e for (label, *_), e in zip(rows, errors) if label.startswith(model + " ")]
        print(f"- {model}: mean {100 * statistics.mean(mine):.1f}%, worst {100 * max(mine):.1f}% "
              f"({len(mine)} configurations)")


if __name__ == "__main__":
    main()
