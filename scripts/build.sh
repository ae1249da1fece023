#!/usr/bin/env bash
# Installs dependencies (scripts/setup.sh) and builds pipetrain into build/ (Release).
#   scripts/build.sh            everything: the tests, benchmarks and fuzz seeds too
#   scripts/build.sh --main     only what the main job runs (scripts/run.sh): the CLI, the
#                               runner and the two daemons, with only their packages
# Further arguments go to CMake, e.g. scripts/build.sh -DPIPETRAIN_BUILD_BENCH=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
setup_flags=()
if [[ "${1:-}" == "--main" ]]; then
  shift
  targets=(pipetrain pipetrain-run pipetrain-coordinator pipetrain-worker)
  setup_flags=(--main)
fi
scripts/setup.sh "${setup_flags[@]}"
# ccache keys that hold for any checkout path and any machine with the same compiler, so a
# fresh clone (CI's bare-machine root included) reuses what an earlier build compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_COMPILERCHECK="${CCACHE_COMPILERCHECK:-content}"
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
elif [[ $# -gt 0 ]]; then
  cmake -S . -B build "$@" >/dev/null
fi
ninja -C build "${targets[@]}"
