#!/usr/bin/env bash
# A checkpoint written by `pipetrain run --launch threads` loads in Python with plain
# torch.load (examples/checkpoint_to_state_dict.py, Debian's python3-torch): every layer's
# parameters, buffers and optimizer state, and the same number of parameters the run reports.
#   python_load_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/run/pipetrain-run" --model mlp --stages 2 --schedule 1f1b --steps 6 \
  --checkpoint-dir "$work/ckpt" --checkpoint-every 2 --checkpoint-keep 2 --threads-per-stage 1 \
  --summary "$work/run.json" -q
ls "$work/ckpt" >"$work/ls.txt"
[[ "$(cat "$work/ckpt/latest")" == "step-00000006" ]] || { echo "latest: $(cat "$work/ckpt/latest")"; exit 1; }
[[ "$(grep -c '^step-' "$work/ls.txt")" == 2 ]] || { echo "kept: $(cat "$work/ls.txt")"; exit 1; }
/usr/bin/python3 "$source/examples/checkpoint_to_state_dict.py" "$work/ckpt" "$work/state.pt" >"$work/summary.json"
/usr/bin/python3 - "$work/state.pt" "$work/summary.json" "$work/run.json" <<'PY'
import json, sys
import torch
state = torch.load(sys.argv[1])
summary = json.load(open(sys.argv[2]))
run = json.load(open(sys.argv[3]))
assert state["step"] == 6 and summary["step"] == 6, (state["step"], summary)
params = sum(t.numel() for k, t in state["model"].items() if ".param." in k)
expected = int(run["model"].split(", ")[1].split()[0])  # "mlp: 5 layers, 6218 parameters"
assert params == expected, (params, run["model"])
# AdamW state for every parameter, shaped like it, after 6 updates.
for key, tensor in state["model"].items():
    if ".param." not in key:
        continue
    s = state["optimizer"][key]
    assert int(s["step"]) == 6, (key, s["step"])
    assert s["exp_avg"].shape == tensor.shape and s["exp_avg_sq"].shape == tensor.shape, key
print("python_load_test: the final checkpoint (step 6) read by torch.load:", summary)
PY
