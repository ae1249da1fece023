#!/usr/bin/env bash
# Installs exactly the Debian 12 packages pipetrain needs to build and test. Idempotent:
# when everything is present it returns at once without touching apt.
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --main     only what building the main job needs (scripts/run.sh): no
#                               clang, clang-format, promtool, Slurm, python3-torch, iproute2
#   scripts/setup.sh --bench    the same as no flag (bench/ compares against Debian's
#                               python3-torch, which the tests use too)
set -euo pipefail
main_only=0
if [[ "${1:-}" == "--main" ]]; then main_only=1; fi

# What building the CLI, the runner and the daemons needs.
packages=(
  # toolchain
  g++ cmake ninja-build ccache git ca-certificates
  # libraries (LibTorch 1.13 CPU; OpenBLAS with pthreads: ~28x faster matmul than the
  # reference BLAS that would otherwise satisfy libtorch's dependency)
  libtorch-dev libgloo-dev libopenblas0-pthread libabsl-dev libyaml-cpp-dev nlohmann-json3-dev
  libcli11-dev
  # control plane: gRPC + protobuf (coordinator, worker, CLI job commands), SQLite (job store)
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libsqlite3-dev
  # checkpoints: SHA-256 of every file (OpenSSL's libcrypto)
  libssl-dev
  # metrics: the daemons' registry (prometheus-cpp's core; its CMake files need the pull
  # library's civetweb, which nothing links) and the /metrics endpoint's gzip (zlib)
  pkgconf prometheus-cpp-dev libcivetweb-dev zlib1g-dev
  # the tests' framework and HTTP client (cpp-httplib, found with pkg-config): CMake's
  # configure step needs them, since the tests are declared beside the code (headers only)
  libgtest-dev libgmock-dev libcpp-httplib-dev
)
# What the tests, the fuzz targets and the benchmarks need besides.
test_packages=(
  # tests (procps: pgrep finds leftover processes; openssl: certificates for mutual TLS;
  # clang with its libFuzzer and sanitizer runtimes: the fuzz targets, scripts/fuzz.sh;
  # clang-format: the sources' format, scripts/format.sh --check)
  procps openssl clang-14 libclang-rt-14-dev clang-format-14
  # promtool (Debian's prometheus): checks the metrics text and the deploy/ rules
  prometheus
  # iproute2: hosts as network namespaces, veth links and bridges (tests/multihost)
  iproute2
  # Python's torch.load reads a checkpoint (examples/checkpoint_to_state_dict.py)
  python3-torch
)

# Slurm and munge for tests/deploy/slurm_test.sh (real munged, slurmctld and slurmd on
# loopback). Installed on their own, with service starts blocked where no init system runs (a
# bare root, a container): if they still cannot be configured, they are removed again, setup
# goes on, and that test skips saying slurmctld is missing.
optional=(slurm-wlm munge)
if [[ $main_only -eq 1 ]]; then
  optional=()
else
  packages+=("${test_packages[@]}")
fi

missing_of() {  # the packages of "$@" not installed
  local p
  for p in "$@"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
      echo "$p"
    fi
  done
}
mapfile -t missing < <(missing_of "${packages[@]}")
mapfile -t missing_optional < <(missing_of "${optional[@]}")
if [[ ${#missing[@]} -eq 0 && ${#missing_optional[@]} -eq 0 ]]; then
  exit 0
fi

sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}" >&2
  if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    echo "setup: apt-get install failed; its last lines:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
fi
if [[ ${#missing_optional[@]} -gt 0 ]]; then
  echo "setup: installing ${missing_optional[*]}" >&2
  policy=""
  if [[ ! -d /run/systemd/system && ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d  # "101: action forbidden", removed below
    printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
    "${sudo[@]}" chmod 755 "$policy"
  fi
  if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" >"$log" 2>&1; then
    echo "setup: ${missing_optional[*]} could not be installed here (the Slurm test will skip);" \
      "apt's last lines:" >&2
    grep -v '^W: Download is performed unsandboxed' "$log" | tail -n 60 >&2
    "${sudo[@]}" apt-get purge -y -qq "${missing_optional[@]}" slurm-client slurmctld slurmd \
      >/dev/null 2>&1 || "${sudo[@]}" dpkg --purge --force-all munge slurm-wlm slurm-client \
      slurmctld slurmd >/dev/null 2>&1 || true
  fi
  if [[ -n "$policy" ]]; then "${sudo[@]}" rm -f "$policy"; fi
fi
