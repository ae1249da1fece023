#!/usr/bin/env bash
# Sets up, builds and runs the main job: `pipetrain run` with the given arguments. With none,
# it trains the built-in GPT on the built-in corpus with 4 pipeline stages (PipeDream-2BW).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh --main >&2
exec build/client/pipetrain run "$@"
