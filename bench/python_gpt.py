#!/usr/bin/python3
"""Eager-PyTorch twin of pipetrain's built-in GPT, timed per training step.

Same architecture and sizes as runtime/model/builtin_layers.cc (token + position embedding;
pre-LN blocks: LayerNorm, causal self-attention with a qkv Linear d->3d with bias and a
proj d->d, LayerNorm, MLP d->4d GELU ->d; final LayerNorm; LM head d->vocab without bias),
the same math in the same order (pipetrain runs the float32 matrix products and attention on
its own kernels, runtime/model/dense_kernels.h; this is the composition of PyTorch operators
they replace), random tokens of the same shape (rows x seq), mean cross-entropy,
AdamW(lr 3e-3, weight_decay 0: pipetrain's defaults). One step = sample a
batch, forward, loss, zero_grad, backward, optimizer step, loss.item(). The step time is
the median of the times between consecutive step ends after the warm-up steps.

Run (always with Debian's python, which has torch 1.13, and the same OpenBLAS threads):
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/python_gpt.py --threads 1 --steps 30
On a GPU (PyTorch 2.x): --device cuda [--dtype bfloat16] [--attention sdpa]: bfloat16 is
torch.autocast over float32 weights (pipetrain's dtype: bfloat16); sdpa uses
F.scaled_dot_product_attention (what a PyTorch user would) instead of the composition above.
Prints one JSON object on stdout.
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads, n_layers, sdpa=False):
        super().__init__()
        proj_std = 0.02 / math.sqrt(2.0 * n_layers)
        self.d, self.heads, self.sdpa = d, heads, sdpa
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        for lin, std in ((self.qkv, 0.02), (self.proj, proj_std), (self.fc, 0.02),
                         (self.fc2, proj_std)):
            nn.init.normal_(lin.weight, std=std)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, -1)
        q, k, v = (y.view(b, t, self.heads, hd).transpose(1, 2) for y in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = torch.softmax(att.masked_fill(causal, float("-inf")), -1)
            y = torch.matmul(att, v)
        y = y.transpose(1, 2).reshape(b, t, d)
        out = x + self.proj(y)
        return out + self.fc2(F.gelu(self.fc(self.ln2(out))))


class Gpt(nn.Module):
    def __init__(self, vocab, seq_len, d, heads, n_layers, sdpa=False):
        super().__init__()
        self.token = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.position = nn.Parameter(torch.randn(seq_len, d) * 0.02)
        self.blocks = nn.Sequential(*[Block(d, heads, n_layers, sdpa) for _ in range(n_layers)])
        self.final_norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)

    def forward(self, ids):
        x = F.embedding(ids, self.token) + self.position[: ids.size(1)]
        return self.lm_head(self.final_norm(self.blocks(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--steps", type=int, default=30, help="measured steps")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    parser.add_argument("--rows", type=int, default=64, help="rows per step (m * b)")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="bfloat16: torch.autocast over float32 weights")
    parser.add_argument("--attention", default="composed", choices=["composed", "sdpa"])
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = Gpt(args.vocab, args.seq_len, args.d_model, args.n_heads, args.n_layers,
                sdpa=args.attention == "sdpa").to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    ends, losses = [], []
    for _ in range(args.warmup + args.steps + 1):
        window = torch.randint(0, args.vocab, (args.rows, args.seq_len + 1), device=device)
        inputs, targets = window[:, :-1], window[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=args.dtype == "bfloat16"):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        ends.append(time.perf_counter())
    times = [b - a for a, b in zip(ends[args.warmup:], ends[args.warmup + 1:])]
    print(json.dumps({
        "step_time_s": statistics.median(times),
        "min_step_time_s": min(times),
        "steps": len(times),
        "threads": torch.get_num_threads(),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "rows": args.rows,
        "parameters": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "device": args.device,
        "dtype": args.dtype,
        "attention": args.attention,
        "tokens_per_s": args.rows * args.seq_len / statistics.median(times),
        "peak_tensor_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
    }))


if __name__ == "__main__":
    main()
