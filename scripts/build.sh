#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh) and builds pipetrain into build/ (Release).
# Extra arguments go to CMake, e.g. scripts/build.sh -DPIPETRAIN_BUILD_BENCH=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [[ $# -gt 0 ]]; then
  cmake -S . -B build "$@" >/dev/null
fi
ninja -C build
