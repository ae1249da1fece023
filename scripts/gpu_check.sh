#!/usr/bin/env bash
# The GPU machine's whole check in one call (docs/gpu.md): what the machine has, the GPU
# build, the device tests and bench/gpu_bench.py, each step bounded in time. What it finds
# goes under $OUT (default out/): machine.txt, build.log, tests.log, gpu_bench.md,
# gpu_bench.json, gpu_bench.err. Needs build-gpu/debs (scripts/gpu_build.sh --download, run
# on Debian 12 beforehand, and carried over).
#   scripts/gpu_check.sh [--quick]   --quick: the benchmark on GPT-2 small only, one round
# Bounds: build 6 min (a warm build-gpu/ rebuilds in seconds), tests 2.5 min, benchmark 4 min
# with --quick and 7 without: a first call with --quick fits 10 minutes unless the build is
# slow; the full benchmark is then a second call on the warm machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/out}
mkdir -p "$out"
quick=()
[[ "${1:-}" == "--quick" ]] && quick=(--quick)

{
  nvidia-smi || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
              torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
  for tool in cmake ninja g++ nvcc dpkg; do
    printf '%s: ' "$tool"
    if command -v "$tool" >/dev/null; then "$tool" --version 2>&1 | head -n 1; else echo missing; fi
  done
  echo "cores: $(nproc)"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
for tool in cmake ninja g++ dpkg; do
  command -v "$tool" >/dev/null || { echo "gpu_check: $tool is missing (docs/gpu.md)"; exit 1; }
done
ls build-gpu/debs/*.deb >/dev/null 2>&1 ||
  { echo "gpu_check: no build-gpu/debs: run scripts/gpu_build.sh --download on Debian 12"; exit 1; }

echo "== build"
start=$SECONDS
if ! timeout 360 scripts/gpu_build.sh > "$out/build.log" 2>&1; then
  tail -n 60 "$out/build.log"
  echo "gpu_check: the build failed after $((SECONDS - start)) s (build.log)"
  exit 1
fi
echo "built in $((SECONDS - start)) s"

echo "== device tests"
(cd build-gpu && timeout 150 ctest -R 'Nccl|Device|TensorMemory' --output-on-failure \
   --timeout 120) > "$out/tests.log" 2>&1
echo "ctest exit $?"
grep -E "tests passed|tests failed|Passed|Failed|Skipped" "$out/tests.log" | tail -n 20

echo "== benchmark"
bench_limit=420
[[ ${#quick[@]} -gt 0 ]] && bench_limit=240
timeout "$bench_limit" python3 bench/gpu_bench.py --build build-gpu "${quick[@]}" \
  --json "$out/gpu_bench.json" > "$out/gpu_bench.md" 2> "$out/gpu_bench.err"
echo "gpu_bench exit $?"
cat "$out/gpu_bench.md"
tail -n 20 "$out/gpu_bench.err"
