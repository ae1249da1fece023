#!/usr/bin/env bash
# Sets up, builds and runs every test (unit and integration) with CTest.
# Extra arguments go to ctest, e.g. scripts/test.sh -R pipeline.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
scripts/fuzz.sh --build-only  # the fuzz targets (clang) now, not while other tests run
ctest --test-dir build --output-on-failure --timeout 900 -j "$(nproc)" "$@"
