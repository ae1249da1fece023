#!/usr/bin/env bash
# Installs exactly the Debian 12 packages pipetrain needs to build and test. Idempotent:
# when everything is present it returns at once without touching apt.
#   scripts/setup.sh            build + test dependencies
#   scripts/setup.sh --bench    the same (bench/ compares against Debian's python3-torch,
#                               which the tests use too)
set -euo pipefail

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
  # metrics: the daemons' /metrics endpoint (cpp-httplib, found with pkg-config)
  libcpp-httplib-dev pkgconf
  # tests (procps: pgrep finds leftover processes; openssl: certificates for mutual TLS;
  # clang with its libFuzzer and sanitizer runtimes: the fuzz targets, scripts/fuzz.sh)
  libgtest-dev libgmock-dev procps openssl clang-14 libclang-rt-14-dev
  slurm-wlm munge  # tests/deploy/slurm_test.sh: real munged, slurmctld, slurmd on loopback
  # promtool (Debian's prometheus): checks the metrics text and the deploy/ rules
  prometheus
  # Python's torch.load reads a checkpoint (examples/checkpoint_to_state_dict.py)
  python3-torch
)

missing=()
for p in "${packages[@]}"; do
  if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "setup: installing ${missing[*]}" >&2
sudo=()
if [[ "$(id -u)" -ne 0 ]]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
log=$(mktemp)
if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
  echo "setup: apt-get install failed; its last lines:" >&2
  tail -n 40 "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
