"""Export an nn.Sequential as TorchScript for `pipetrain run --torchscript model.pt`.

Each child of the Sequential becomes one pipeline layer, in order. The last layer must
return logits [..., classes]; the loss is cross-entropy against integer targets.

    /usr/bin/python3 examples/export_torchscript.py model.pt
    pipetrain run --torchscript model.pt --data classification --stages 2 --schedule gpipe
"""
import sys

import torch
from torch import nn


def main(path: str) -> None:
    model = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )
    torch.jit.script(model).save(path)
    print(f"saved {path}: {len(model)} layers")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "model.pt")
