#!/usr/bin/python3
"""pipetrain against its PyTorch peers: the same GPT, data shape, batch and threads.

For R rounds, interleaved (every run once per round, the order rotating from round to
round so that machine noise hits every side), on one machine:

  one process, the whole batch
    pipetrain 1 stage    pipetrain-run --launch threads --stages 1 --microbatches 1
    eager                the same GPT in eager PyTorch (bench/python_gpt.py's model: same
                         operators in the same order)
    eager encoder        an eager loop over nn.TransformerEncoderLayer (norm_first, batch_first,
                         GELU, causal mask, dropout 0), embedding, final LayerNorm and LM head
    eager, CORETYPE      the eager GPT again with OPENBLAS_CORETYPE set (--coretype; by default
                         SKYLAKEX on a CPU with AVX-512): OpenBLAS 0.3.21 does not recognize
                         every AVX-512 CPU and then falls back to AVX2 kernels, which halves
                         the rate of every matrix product (docs/performance.md)
  two data-parallel processes, half the batch each
    pipetrain 2 replicas --launch processes --stages 1 --replicas 2 --microbatches 1
    DDP                  torch.nn.parallel.DistributedDataParallel over Gloo, 2 processes
  two pipeline stages
    pipetrain gpipe / 1f1b / 2bw   --launch processes --stages 2 --microbatches M
    Pipe                 torch.distributed.pipeline.sync.Pipe, 2 partitions, M chunks,
                         checkpoint="never": on CPU it runs every partition in one thread, so
                         it is a reference, not a pipelined peer

Every process runs THREADS intra-op threads (OPENBLAS_NUM_THREADS and OMP_NUM_THREADS too);
AdamW (lr 3e-3, no weight decay), float32, ROWS x SEQ tokens per step. Reported per run,
medians over the rounds:
  step ms      median time between consecutive step ends after the warm-up steps
  tokens/s     ROWS * SEQ / step
  peak MiB     resident high-water mark (VmHWM of /proc/PID/status) summed over the
               processes that train (not over launchers: pipetrain-run's parent in
               --launch processes, this script)
  / eager      step time over the eager GPT's (one process, the whole batch)
  ME           memory efficiency against DDP: (throughput / DDP's) / (memory / DDP's)
A markdown table goes to stdout, progress to stderr.

Run (Debian's python3-torch):
  /usr/bin/python3 bench/peers.py [build/run/pipetrain-run] [--rounds 3] [--steps 6]
A `pipetrain` CLI binary works too (its `run`). About 5 minutes on 2 cores with the
defaults; --before OLD/pipetrain-run adds every pipetrain run of an earlier build to the same
rounds ("pipetrain before"; 7 minutes in all). Standard library and torch only.
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------ workers (PyTorch side)

def vm_hwm_bytes(pid="self"):
    """VmHWM of a process in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def build_gpt(args):
    import torch
    sys.path.insert(0, HERE)
    from python_gpt import Gpt
    torch.manual_seed(args.seed)
    return Gpt(args.vocab, args.seq_len, args.d_model, args.n_heads, args.n_layers)


def build_encoder_gpt(args):
    import torch
    from torch import nn

    class EncoderGpt(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.d_model
            self.token = nn.Embedding(args.vocab, d)
            self.position = nn.Parameter(torch.randn(args.seq_len, d) * 0.02)
            self.blocks = nn.ModuleList([
                nn.TransformerEncoderLayer(d, args.n_heads, 4 * d, dropout=0.0,
                                           activation="gelu", batch_first=True,
                                           norm_first=True)
                for _ in range(args.n_layers)])
            self.final_norm = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, args.vocab, bias=False)
            self.register_buffer(
                "causal", torch.ones(args.seq_len, args.seq_len, dtype=torch.bool).triu(1))

        def forward(self, ids):
            t = ids.size(1)
            x = self.token(ids) + self.position[:t]
            for block in self.blocks:
                x = block(x, src_mask=self.causal[:t, :t])
            return self.lm_head(self.final_norm(x))

    torch.manual_seed(args.seed)
    return EncoderGpt()


def build_pipe(args):
    """python_gpt's GPT as torch.distributed.pipeline.sync.Pipe with two partitions."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed import rpc
    from torch.distributed.pipeline.sync import Pipe

    gpt = build_gpt(args)

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.token, self.position = gpt.token, gpt.position

        def forward(self, ids):
            return F.embedding(ids, self.token) + self.position[: ids.size(1)]

    half = args.n_layers // 2
    blocks = list(gpt.blocks)
    first = nn.Sequential(Embedding(), *blocks[:half])
    second = nn.Sequential(*blocks[half:], gpt.final_norm, gpt.lm_head)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    rpc.init_rpc("pipe", rank=0, world_size=1)  # Pipe needs the RPC framework
    pipe = Pipe(nn.Sequential(first, second), chunks=args.microbatches, checkpoint="never")

    class Unwrap(nn.Module):  # Pipe returns an RRef
        def __init__(self):
            super().__init__()
            self.pipe = pipe

        def forward(self, ids):
            return self.pipe(ids).local_value()

    return Unwrap()


def worker(args):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    rank, world = args.rank, args.world
    if args.worker == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                                world_size=world)
        model = DistributedDataParallel(build_gpt(args))
    elif args.worker == "encoder":
        model = build_encoder_gpt(args)
    elif args.worker == "pipe":
        model = build_pipe(args)
    else:
        model = build_gpt(args)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    rows = args.rows // world
    generator = torch.Generator().manual_seed(args.seed + rank)
    ends = []
    for _ in range(args.warmup + args.steps + 1):
        window = torch.randint(0, args.vocab, (rows, args.seq_len + 1), generator=generator)
        inputs, targets = window[:, :-1], window[:, 1:]
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        ends.append(time.perf_counter())
    times = [b - a for a, b in zip(ends[args.warmup:], ends[args.warmup + 1:])]
    if args.worker == "pipe":
        from torch.distributed import rpc
        rpc.shutdown()
    print(json.dumps({"step_time_s": statistics.median(times), "peak_memory_bytes": vm_hwm_bytes(),
                      "parameters": sum(p.numel() for p in model.parameters())}))


# ------------------------------------------------------------------ the driver

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_env(args, extra=None):
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = str(args.threads)
    env["OMP_NUM_THREADS"] = str(args.threads)
    env.update(extra or {})
    return env


def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def run_watched(cmd, env, count_children):
    """Runs cmd; returns (stdout, peak bytes). The peak is the process's own VmHWM, or with
    count_children the sum of its children's (polled every 0.1 s: VmHWM only grows)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peaks = {}
    while proc.poll() is None:
        for pid in (children_of(proc.pid) if count_children else [proc.pid]):
            peaks[pid] = max(peaks.get(pid, 0), vm_hwm_bytes(pid))
        time.sleep(0.1)
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    return out, sum(peaks.values())


def pipetrain(args, flags, binary):
    """One pipetrain run: (step_time_s, peak bytes over the processes that train)."""
    launch_processes = "processes" in flags
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        cmd = [binary] + (["run"] if os.path.basename(binary) == "pipetrain" else [])
        cmd += ["-q", "--summary", summary, "--steps", str(args.warmup + args.steps),
                "--threads-per-stage", str(args.threads), "--seed", str(args.seed),
                "--d-model", str(args.d_model), "--n-heads", str(args.n_heads),
                "--n-layers", str(args.n_layers), "--seq-len", str(args.seq_len),
                "--vocab", str(args.vocab)] + flags
        _, polled = run_watched(cmd, thread_env(args), count_children=launch_processes)
        with open(summary) as f:
            report = json.load(f)
    # pipetrain's step_time_s is the median of the times between step ends after the first
    # step: warm-up + steps steps give warm-up + steps - 1 of them, the median robust to the
    # warm-up ones.
    peak = polled if launch_processes else max(s["peak_memory_bytes"] for s in report["per_stage"])
    return report["step_time_s"], peak


def torch_worker(args, kind, extra_env=None, world=1):
    """One PyTorch peer with `world` worker processes: (step_time_s of rank 0, summed peak)."""
    base = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--world", str(world),
            "--port", str(free_port())]
    for name in ("threads", "steps", "warmup", "rows", "seq_len", "vocab", "d_model", "n_heads",
                 "n_layers", "seed", "microbatches"):
        base += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    env = thread_env(args, extra_env)
    procs = [subprocess.Popen(base + ["--rank", str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for r, proc in enumerate(procs):
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            for other in procs:
                other.kill()
            sys.exit(f"{kind} rank {r} failed ({proc.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results[0]["step_time_s"], sum(x["peak_memory_bytes"] for x in results)


def avx512_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False


def runs_of(args):
    """name -> (group, processes, thunk)."""
    m = str(args.microbatches)
    whole = ["--microbatches", "1", "--microbatch-size", str(args.rows)]
    pipelined = ["--launch", "processes", "--stages", "2", "--microbatches", m,
                 "--microbatch-size", str(args.rows // args.microbatches)]
    runs = {}

    def add_pipetrain(name, group, processes, flags):
        runs[f"pipetrain{name}"] = (group, processes, lambda: pipetrain(args, flags, args.binary))
        if args.before:
            runs[f"pipetrain before{name}"] = (
                group, processes, lambda: pipetrain(args, flags, args.before))

    add_pipetrain(", 1 stage", 1, 1, ["--launch", "threads", "--stages", "1", "--schedule", "1f1b"]
                  + whole)
    runs["eager PyTorch"] = (1, 1, lambda: torch_worker(args, "eager"))
    runs["eager PyTorch, nn.TransformerEncoderLayer"] = (1, 1, lambda: torch_worker(args, "encoder"))
    if args.coretype:
        runs[f"eager PyTorch, OPENBLAS_CORETYPE={args.coretype}"] = (
            1, 1, lambda: torch_worker(args, "eager", {"OPENBLAS_CORETYPE": args.coretype}))
    add_pipetrain(", 2 replicas", 2, 2, [
        "--launch", "processes", "--stages", "1", "--replicas", "2", "--schedule", "1f1b",
        "--microbatches", "1", "--microbatch-size", str(args.rows // 2)])
    runs["PyTorch DDP (Gloo), 2 processes"] = (2, 2, lambda: torch_worker(args, "ddp", world=2))
    for schedule in ("gpipe", "1f1b", "2bw"):
        add_pipetrain(f" {schedule}, 2 stages, m={m}", 3, 2, pipelined + ["--schedule", schedule])
    runs[f"PyTorch Pipe, 2 partitions, {m} chunks (one thread)"] = (
        3, 1, lambda: torch_worker(args, "pipe"))
    if args.only:
        runs = {k: v for k, v in runs.items() if any(word in k for word in args.only)}
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("binary", nargs="?", default="build/run/pipetrain-run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--rows", type=int, default=64, help="sequences per step (global)")
    parser.add_argument("--microbatches", type=int, default=8, help="pipelined runs: m")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-layers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--coretype", default="SKYLAKEX" if avx512_cpu() else "",
                        help="OPENBLAS_CORETYPE of the extra eager run ('' for none)")
    parser.add_argument("--only", nargs="*", help="runs whose name contains one of these")
    parser.add_argument("--before", help="another pipetrain binary (an earlier build): its "
                        "runs join the table as 'pipetrain before'")
    # Internal: one PyTorch worker process.
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.rows % 2 or args.rows % args.microbatches:
        sys.exit("--rows must be even and a multiple of --microbatches")
    for binary in filter(None, (args.binary, args.before)):
        if not os.access(binary, os.X_OK):
            sys.exit(f"not an executable: {binary} (build pipetrain-run, or pass its path)")

    runs = runs_of(args)
    names = list(runs)
    times = {n: [] for n in names}
    peaks = {n: [] for n in names}
    start = time.monotonic()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            t, peak = runs[name][2]()
            times[name].append(t)
            peaks[name].append(peak)
            print(f"round {r}: {name}: {t * 1e3:.1f} ms, {peak / 2**20:.0f} MiB "
                  f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    step = {n: statistics.median(times[n]) for n in names}
    mem = {n: statistics.median(peaks[n]) for n in names}
    tokens = args.rows * args.seq_len
    eager = step.get("eager PyTorch")
    ddp = "PyTorch DDP (Gloo), 2 processes"
    print(f"GPT d_model {args.d_model}, {args.n_heads} heads, {args.n_layers} blocks, seq "
          f"{args.seq_len}, vocab {args.vocab}; {args.rows} sequences per step; float32 AdamW; "
          f"{args.threads} thread(s) per process; median step over {args.steps} steps after "
          f"{args.warmup} warm-up, median over {args.rounds} interleaved rounds.\n")
    print("| run | processes | step ms | tokens/s | peak MiB | step / eager | ME vs DDP |")
    print("|---|---|---|---|---|---|---|")
    for n in names:
        rel = f"{step[n] / eager:.3f}" if eager else "-"
        me = "-"
        if ddp in step:
            me = f"{(step[ddp] / step[n]) / (mem[n] / mem[ddp]):.2f}"
        print(f"| {n} | {runs[n][1]} | {step[n] * 1e3:.1f} | {tokens / step[n]:.0f} | "
              f"{mem[n] / 2**20:.0f} | {rel} | {me} |")
    print()
    ratios = []
    one = "pipetrain, 1 stage"
    if one in step and eager:
        ratios.append(f"1 stage / eager {step[one] / eager:.3f} (aim <= 1.0)")
    if "pipetrain before, 1 stage" in step and eager:
        ratios.append(f"before: 1 stage / eager {step['pipetrain before, 1 stage'] / eager:.3f}")
    for n in names:
        if n.startswith("eager PyTorch,") and one in step:
            ratios.append(f"1 stage / {n[len('eager PyTorch, '):]} {step[one] / step[n]:.3f}")
    for who in ("pipetrain", "pipetrain before"):
        if f"{who}, 2 replicas" in step and ddp in step:
            ratios.append(f"{who[len('pipetrain '):] + ': ' if ' ' in who else ''}2 replicas / "
                          f"DDP {step[f'{who}, 2 replicas'] / step[ddp]:.3f}" +
                          ("" if " " in who else " (aim <= 1.0)"))
    if eager:
        staged = [n for n in names if n.startswith("pipetrain ") and "2 stages" in n]
        if staged:
            ratios.append("2 stages / eager " + ", ".join(
                f"{n[len('pipetrain '):n.index(',')]} {step[n] / eager:.3f}" for n in staged) +
                " (aim <= 0.55)")
    print("Ratios of step times: " + "; ".join(ratios) + ".")


if __name__ == "__main__":
    main()
