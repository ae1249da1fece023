#!/usr/bin/env python3
"""Converts a pipetrain checkpoint to one PyTorch file, with plain torch.load.

    checkpoint_to_state_dict.py CHECKPOINT OUT.pt

CHECKPOINT is a step-N directory, or a checkpoint root (its `latest` is taken). Every file is
checked against the manifest (size and SHA-256) first. OUT.pt holds
    {"step": N,                      # the weights are W(N); a resumed job runs from step N
     "job": {...},                   # the job that wrote it (model, data, schedule, ...)
     "model": {"layers.I.param.K": tensor, "layers.I.buffer.K": tensor, ...},
     "optimizer": {"layers.I.param.K": {"step": ..., "exp_avg": ..., "exp_avg_sq": ...}},
     "stale_model": {...}}           # PipeDream-2BW only: W(N-1), what step N runs on
with I the global layer index and K the tensor's position in that layer. It prints one line
of JSON describing what it wrote.
"""
import hashlib
import json
import os
import sys

import torch


def checkpoint_dir(path):
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    with open(os.path.join(path, "latest")) as f:
        return os.path.join(path, f.read().strip())


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    directory = checkpoint_dir(sys.argv[1])
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest.get("format") != 1:
        sys.exit(f"{directory}: manifest format {manifest.get('format')} is not 1")
    model, optimizer, stale = {}, {}, {}
    for entry in manifest["files"]:
        path = os.path.join(directory, entry["name"])
        with open(path, "rb") as f:
            data = f.read()
        if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            sys.exit(f"{path}: its size or SHA-256 is not the manifest's")
        layer = torch.load(path)  # a dict of tensors
        for key, tensor in layer.items():
            kind, _, rest = key.partition(".")
            name = f"layers.{entry['layer']}"
            if kind in ("param", "buffer"):
                model[f"{name}.{key}"] = tensor
            elif kind in ("stale_param", "stale_buffer"):
                stale[f"{name}.{kind[len('stale_'):]}.{rest}"] = tensor
            else:  # optim.K.NAME
                position, _, state = rest.partition(".")
                optimizer.setdefault(f"{name}.param.{position}", {})[state] = tensor
    out = {"step": manifest["step"], "job": manifest["job"], "model": model,
           "optimizer": optimizer}
    if stale:
        out["stale_model"] = stale
    torch.save(out, sys.argv[2])
    print(json.dumps({"checkpoint": directory, "step": manifest["step"],
                      "layers": len(manifest["files"]), "tensors": len(model),
                      "parameters": sum(t.numel() for k, t in model.items() if ".param." in k),
                      "optimizer_states": len(optimizer)}))


if __name__ == "__main__":
    main()
