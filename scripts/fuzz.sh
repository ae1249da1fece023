#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang in build-fuzz/ and runs each for a while,
# starting from its seed corpus in fuzz/corpus/<target>/.
#   scripts/fuzz.sh                        every target for 10 s (what the tests run)
#   scripts/fuzz.sh --seconds 3600 coordinator_fuzzer
#                                          one target for an hour: a long run
#   scripts/fuzz.sh --merge ...            also add the inputs that found new coverage to
#                                          fuzz/corpus/<target>/ (minimized)
#   scripts/fuzz.sh --build-only           build them, run nothing (scripts/test.sh does this
#                                          before the tests, which then only run them)
# A crash, a sanitizer report, a leak or a hang (an input over 10 s) fails the script; the
# input is kept in build-fuzz/artifacts/ (rerun it: build-fuzz/fuzz/<target> FILE) and the
# report printed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=10
merge=0
build_only=0
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --merge) merge=1; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(job_spec_yaml_fuzzer wire_header_fuzzer checkpoint_manifest_fuzzer coordinator_fuzzer)
fi

scripts/setup.sh
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_COMPILERCHECK="${CCACHE_COMPILERCHECK:-content}"
if [[ ! -f build-fuzz/build.ninja ]]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPIPETRAIN_FUZZ=ON -DPIPETRAIN_BUILD_TESTS=OFF -DPIPETRAIN_BUILD_BENCH=OFF \
    -DPIPETRAIN_WITH_NCCL=OFF >/dev/null
fi
ninja -C build-fuzz fuzzers
[[ ${build_only} == 1 ]] && exit 0

mkdir -p build-fuzz/artifacts
status=0
for target in "${targets[@]}"; do
  seeds="fuzz/corpus/${target}"
  work=$(mktemp -d)
  cp -r "${seeds}/." "${work}/" 2>/dev/null || true
  log="build-fuzz/artifacts/${target}.log"
  echo "fuzz: ${target} for ${seconds} s from $(ls "${seeds}" 2>/dev/null | wc -l) seeds" >&2
  if ASAN_OPTIONS=detect_leaks=1 "build-fuzz/fuzz/${target}" -max_total_time="${seconds}" \
      -timeout=10 -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/artifacts/${target}-" "${work}" >"${log}" 2>&1; then
    grep -E "^stat::number_of_executed_units|^stat::new_units_added" "${log}" | sed "s/^/fuzz: ${target}: /" >&2
    if [[ ${merge} == 1 ]]; then
      "build-fuzz/fuzz/${target}" -merge=1 "${seeds}" "${work}" >/dev/null 2>&1
    fi
  else
    echo "fuzz: ${target} FAILED; its report (${log}):" >&2
    grep -v -E "^#[0-9]+|^INFO:|^\"" "${log}" | tail -60 >&2
    status=1
  fi
  rm -rf "${work}"
done
exit ${status}
