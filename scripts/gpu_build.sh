#!/usr/bin/env bash
# Builds only the NCCL transport test against the CUDA LibTorch of this machine's PyTorch, on
# a GPU machine without apt (docs/gpu.md). Not yet run on a GPU.
#   scripts/gpu_build.sh --download  on Debian 12: fetch the .deb files of the dependencies
#                                    other than LibTorch into build-gpu/debs
#   scripts/gpu_build.sh             on the GPU machine: unpack them into build-gpu/deps with
#                                    dpkg -x, configure build-gpu/, build nccl_transport_test
# Then: (cd build-gpu && ctest -R Nccl --output-on-failure)
# TORCH_PREFIX overrides LibTorch's CMake prefix (default: the installed PyTorch's).
set -euo pipefail
cd "$(dirname "$0")/.."
debs=(libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32)
if [[ "${1:-}" == "--download" ]]; then
  mkdir -p build-gpu/debs
  (cd build-gpu/debs && apt-get download "${debs[@]}")
  exit 0
fi
for deb in build-gpu/debs/*.deb; do dpkg -x "$deb" build-gpu/deps; done
# protoc (the job spec is a protobuf message) runs from the unpacked tree.
export LD_LIBRARY_PATH="$PWD/build-gpu/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
torch_prefix=${TORCH_PREFIX:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
# Prefer the NCCL of PyTorch's own wheel (under site-packages/nvidia/): one libnccl.so.2 then
# serves both LibTorch and pipetrain. Otherwise CMake looks beside the CUDA toolkit's cudart.
nccl=()
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
       2>/dev/null || true)
lib=$(find "$site/nvidia" -name 'libnccl.so*' 2>/dev/null | head -n 1 || true)
if [[ -n "$lib" && -f "$(dirname "$lib")/../include/nccl.h" ]]; then
  nccl=(-DNCCL_LIBRARY="$lib" -DNCCL_INCLUDE_DIR="$(dirname "$lib")/../include")
fi
# DT_RPATH rather than DT_RUNPATH: the unpacked libraries' own dependencies (libabsl_* on
# libabsl_*) are then found in build-gpu/deps too, without LD_LIBRARY_PATH.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_BUILD_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$PWD/build-gpu/deps/usr;$torch_prefix" \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags "${nccl[@]}"
ninja -C build-gpu nccl_transport_test
