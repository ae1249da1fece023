#!/usr/bin/env bash
# Builds pipetrain against the CUDA LibTorch of this machine's PyTorch, on a GPU machine
# without apt (docs/gpu.md): pipetrain-run, the worker daemon, the coordinator, the CLI and
# the device tests, with every other dependency carried as Debian 12 packages.
#   scripts/gpu_build.sh --download    on Debian 12: fetch the .deb files into build-gpu/debs
#   scripts/gpu_build.sh [TARGET...]   on the GPU machine: unpack them into build-gpu/deps
#                                      (dpkg -x), configure build-gpu/ and build TARGETs
#                                      (default: pipetrain-run pipetrain-worker
#                                      pipetrain-coordinator pipetrain nccl_transport_test
#                                      device_test profiler_test)
# Then: (cd build-gpu && ctest -R 'Nccl|Device|TensorMemory' --output-on-failure)
# TORCH_PREFIX overrides LibTorch's CMake prefix (default: the installed PyTorch's; /usr
# checks everything but CUDA on Debian with its CPU LibTorch).
set -euo pipefail
cd "$(dirname "$0")/.."
debs=(
  # compiling, linking and running: every library of the runtime uses Abseil
  libabsl-dev libabsl20220623
  # the job spec is a protobuf message; protoc runs from the unpacked tree
  libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32
  # the daemons: gRPC and what its CMake files look for (c-ares, re2, OpenSSL, zlib)
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libc-ares-dev libc-ares2 libre2-dev libre2-9 libssl-dev libssl3 zlib1g-dev zlib1g
  # the daemons' metrics (prometheus-cpp's core; its CMake files look for pull, civetweb and
  # push's libcurl, none of them linked), the tests' HTTP client (cpp-httplib, through
  # pkg-config) and
  # the coordinator's store
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libprometheus-cpp-push1.0 libcivetweb-dev libcivetweb1 civetweb libcurl4-openssl-dev libcurl4
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 libsqlite3-dev libsqlite3-0
  # pkg-config itself (gRPC's CMake files find re2 with it)
  pkgconf pkgconf-bin libpkgconf3
  # configuring: yaml-cpp's CMake file checks that its .so exists; header-only libraries
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev
  # the tests (static libraries built by GCC 12)
  libgtest-dev libgmock-dev
)
if [[ "${1:-}" == "--download" ]]; then
  mkdir -p build-gpu/debs
  (cd build-gpu/debs && apt-get download "${debs[@]}")
  exit 0
fi
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(pipetrain-run pipetrain-worker pipetrain-coordinator pipetrain nccl_transport_test
           device_test profiler_test)
fi
deps="$PWD/build-gpu/deps"
for deb in build-gpu/debs/*.deb; do dpkg -x "$deb" "$deps"; done
libdir="$deps/usr/lib/x86_64-linux-gnu"
# The unpacked .pc files name /usr: point them at the unpacked tree, and let pkg-config look
# nowhere else.
for pc in "$libdir"/pkgconfig/*.pc "$deps"/usr/share/pkgconfig/*.pc; do
  [[ -f "$pc" ]] && sed -i -E "s|^([A-Za-z_]+)=/usr|\1=$deps/usr|" "$pc"
done
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$deps/usr/share/pkgconfig"
# protoc, grpc_cpp_plugin and pkgconf run from the unpacked tree.
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
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
# libabsl_*, libgrpc++ on libgrpc) are then found in build-gpu/deps too, without
# LD_LIBRARY_PATH.
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPIPETRAIN_BUILD_BENCH=OFF \
  -DCMAKE_PREFIX_PATH="$deps/usr;$torch_prefix" \
  -DPKG_CONFIG_EXECUTABLE="$deps/usr/bin/pkgconf" \
  -DPIPETRAIN_WITH_DAEMONS=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags "${nccl[@]}"
ninja -C build-gpu "${targets[@]}"
