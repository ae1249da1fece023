#!/usr/bin/env python3
"""pipetrain on one GPU against eager PyTorch, in bfloat16 (docs/gpu.md).

Run on the GPU machine after scripts/gpu_build.sh, with that machine's PyTorch:
  python3 bench/gpu_bench.py --build build-gpu [--steps 20] [--rounds 2] [--quick]

For each model (GPT-2 small's shape and a 1.3B GPT: d 2048, 16 heads, 24 blocks; sequence
1024, vocabulary 50257, synthetic tokens, 8 sequences a step, AdamW), interleaved in rounds:
  - pipetrain, one stage (`pipetrain-run --device cuda --dtype bfloat16 --stages 1`);
  - eager PyTorch (bench/python_gpt.py --device cuda --dtype bfloat16), the same math
    composed of operators, and with F.scaled_dot_product_attention (what a user would run);
then, on GPT-2 small with 32 sequences a step: 4 stages in one process (1F1B, 8
micro-batches of 4) against 1 stage with the same micro-batches: the cost of pipelining itself
on one GPU. Prints a Markdown table: step time (median over rounds), tokens/s, ratio against
eager, MFU, and peak tensor memory (the CUDA caching allocator's). MFU counts
6 x (parameters without the embeddings) + 12 x blocks x d x sequence FLOPs per token (the
PaLM formula) against the GPU's dense bfloat16 peak (--peak-tflops; 989.4 for H100/H200 SXM).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

MODELS = {
    "gpt2-small": dict(d=768, heads=12, layers=12),
    "gpt-1.3b": dict(d=2048, heads=16, layers=24),
}
# --smoke: the script's own check on a machine without a GPU (tiny models, on the CPU).
SMOKE_MODELS = {
    "gpt2-small": dict(d=64, heads=4, layers=2),
    "gpt-1.3b": dict(d=64, heads=4, layers=4),
}


def run(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\nexit {p.returncode}\n{p.stderr[-3000:]}")
    return p.stdout


def pipetrain(args, model, rows, seq, vocab, stages=1, microbatches=1):
    m = MODELS[model]
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        run([os.path.join(args.build, "run", "pipetrain-run"), "-q", "--summary", summary,
             "--device", args.device, "--dtype", "bfloat16", "--schedule", "1f1b",
             "--stages", str(stages), "--microbatches", str(microbatches),
             "--microbatch-size", str(rows // microbatches), "--seq-len", str(seq),
             "--vocab", str(vocab), "--d-model", str(m["d"]), "--n-heads", str(m["heads"]),
             "--n-layers", str(m["layers"]), "--steps", str(args.steps + 2),
             "--num-tokens", str(max(1 << 20, 4 * rows * (seq + 1)))], timeout=900)
        with open(summary) as f:
            s = json.load(f)
    return {
        "step_time_s": s["step_time_s"],
        "tokens_per_s": s["tokens_per_s"],
        "parameters": sum(st["parameter_bytes"] for st in s["per_stage"]) // 4,
        "peak_tensor_bytes": max(st["peak_tensor_bytes"] for st in s["per_stage"]),
        "final_loss": s["final_loss"],
    }


def eager(args, model, rows, seq, vocab, attention):
    m = MODELS[model]
    out = run([sys.executable, os.path.join(HERE, "python_gpt.py"), "--device", args.device,
               "--dtype", "bfloat16", "--attention", attention, "--rows", str(rows),
               "--seq-len", str(seq), "--vocab", str(vocab), "--d-model", str(m["d"]),
               "--n-heads", str(m["heads"]), "--n-layers", str(m["layers"]),
               "--steps", str(args.steps), "--warmup", "2"], timeout=900)
    return json.loads(out.strip().splitlines()[-1])


def flops_per_token(model, parameters, seq, vocab):
    m = MODELS[model]
    dense = parameters - vocab * m["d"] - seq * m["d"]  # embeddings are lookups
    return 6 * dense + 12 * m["layers"] * m["d"] * seq


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build-gpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--rows", type=int, default=8, help="sequences per step")
    parser.add_argument("--peak-tflops", type=float, default=0,
                        help="dense bfloat16 peak (default: 989.4 for H100/H200 SXM)")
    parser.add_argument("--quick", action="store_true", help="GPT-2 small only, one round")
    parser.add_argument("--json", help="also write every run here")
    parser.add_argument("--smoke", action="store_true",
                        help="check this script on the CPU with tiny models (no figures)")
    args = parser.parse_args()
    args.device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        MODELS.update(SMOKE_MODELS)
        args.steps, args.seq_len, args.vocab, args.rounds = 3, 32, 64, 1

    import torch  # the machine's PyTorch: the GPU's name and the peak
    name = "CPU (smoke check)" if args.smoke else torch.cuda.get_device_name(0)
    peak = args.peak_tflops or (989.4 if ("H100" in name or "H200" in name) and "PCIe" not in name
                                else 0)
    models = ["gpt2-small"] if args.quick else list(MODELS)
    rounds = 1 if args.quick else args.rounds
    seq, vocab, rows = args.seq_len, args.vocab, args.rows

    results = {}  # (model, run) -> list of dicts
    for r in range(rounds):
        for model in models:
            for label, fn in (
                ("pipetrain, 1 stage", lambda: pipetrain(args, model, rows, seq, vocab)),
                ("eager PyTorch (composed attention)",
                 lambda: eager(args, model, rows, seq, vocab, "composed")),
                ("eager PyTorch (SDPA)", lambda: eager(args, model, rows, seq, vocab, "sdpa")),
            ):
                if "SDPA" in label and not hasattr(torch.nn.functional,
                                                   "scaled_dot_product_attention"):
                    continue  # PyTorch < 2.0 (the smoke check on Debian's)
                try:
                    result = fn()
                except Exception as e:  # an OOM or a failure: say it, go on
                    print(f"round {r} {model} {label}: {e}", file=sys.stderr)
                    continue
                results.setdefault((model, label), []).append(result)
        for label, stages in (("pipetrain 1f1b, 1 stage, m=8", 1),
                              ("pipetrain 1f1b, 4 stages in one process, m=8", 4)):
            try:
                result = pipetrain(args, "gpt2-small", 4 * rows, seq, vocab, stages, 8)
            except Exception as e:
                print(f"round {r} gpt2-small {label}: {e}", file=sys.stderr)
                continue
            results.setdefault(("gpt2-small", label), []).append(result)

    print(f"GPU: {name}; PyTorch {torch.__version__}; sequence {seq}, vocabulary {vocab}; "
          f"{args.steps} steps a run, median over {rounds} round(s); peak {peak} TFLOP/s\n")
    print("| model | run | step ms | tokens/s | vs eager (composed) | MFU | peak tensor GiB |")
    print("|---|---|---|---|---|---|---|")
    for (model, label), runs in results.items():
        step = statistics.median(x["step_time_s"] for x in runs)
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        base = results.get((model, "eager PyTorch (composed attention)"))
        ratio = (f"{tps / statistics.median(x['tokens_per_s'] for x in base):.3f}"
                 if base and label.startswith("pipetrain, 1 stage") else "")
        params = runs[0]["parameters"]
        mfu = f"{100 * tps * flops_per_token(model, params, seq, vocab) / (peak * 1e12):.1f}%" \
            if peak else ""
        mem = max(x.get("peak_tensor_bytes") or 0 for x in runs) / 2**30
        print(f"| {model} ({params / 1e6:.0f}M) | {label} | {1e3 * step:.1f} | {tps:,.0f} | "
              f"{ratio} | {mfu} | {mem:.2f} |")
    one = results.get(("gpt2-small", "pipetrain 1f1b, 1 stage, m=8"))
    four = results.get(("gpt2-small", "pipetrain 1f1b, 4 stages in one process, m=8"))
    if one and four:
        a = statistics.median(x["step_time_s"] for x in one)
        b = statistics.median(x["step_time_s"] for x in four)
        print(f"\n4 stages in one process / 1 stage (GPT-2 small, 1F1B, m=8): {b / a:.3f} "
              f"(the stages take turns on the one GPU: 1.0 would be pipelining for free)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{m} | {l}": v for (m, l), v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
