#!/usr/bin/env bash
# Builds the pipetrain CPU image (deploy/container/Dockerfile) with Debian 12's podman 4.3 /
# buildah 1.28 on a machine without Docker Hub, then runs a coordinator and two workers from it
# and trains a small job through them with `pipetrain submit --follow`.
#
#   deploy/container/build_and_run.sh                # everything
#   deploy/container/build_and_run.sh --run-only     # reuse localhost/pipetrain:cpu, only run
#   deploy/container/build_and_run.sh --fresh-base   # also re-debootstrap the base image
#
# Settings (the ones that work on a host with the hybrid cgroup layout and no systemd):
# runtime runc, cgroup_manager cgroupfs, explicit ulimits nofile=1024:1024 nproc=4096:4096,
# storage driver vfs with graphroot/runroot under $PIPETRAIN_IMAGE_WORK, events_logger file;
# all in a containers.conf / storage.conf named by CONTAINERS_CONF / CONTAINERS_STORAGE_CONF, so
# the host's own podman configuration is neither read nor changed. The base image is Debian 12
# from debootstrap (minbase) against the mirror in /etc/apt/sources.list.d/debian.sources, with
# the host's apt sources and apt.conf.d settings copied in so apt works inside the build.
#
# Environment: PIPETRAIN_IMAGE_WORK (default /var/tmp/pipetrain-image: configs, base root
# file system, image storage), PIPETRAIN_BUILD_TIMEOUT (seconds, default 14400),
# PIPETRAIN_JOB_TIMEOUT (seconds, default 900). Needs root and podman buildah runc debootstrap.
# Heavy steps run under `nice -n 19 ionice -c3`.
set -euo pipefail

run_only=0
fresh_base=0
for arg in "$@"; do
  case "$arg" in
    --run-only) run_only=1 ;;
    --fresh-base) fresh_base=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${PIPETRAIN_IMAGE_WORK:-/var/tmp/pipetrain-image}
build_timeout=${PIPETRAIN_BUILD_TIMEOUT:-14400}
job_timeout=${PIPETRAIN_JOB_TIMEOUT:-900}
image=localhost/pipetrain:cpu
base=localhost/debian-bookworm
low=(nice -n 19 ionice -c3)

for tool in podman buildah runc debootstrap ss timeout; do
  command -v "$tool" >/dev/null || { echo "missing $tool (apt-get install -y podman buildah runc debootstrap)" >&2; exit 1; }
done
[[ "$(id -u)" -eq 0 ]] || { echo "run as root (rootful podman, debootstrap)" >&2; exit 1; }

# ---- timings ----------------------------------------------------------------------------
declare -a phase_names=() phase_secs=()
phase_start=0
phase_name=""
now() { date +%s.%N; }
begin() { phase_name=$1; phase_start=$(now); echo "=== $1" >&2; }
end() {
  local secs; secs=$(awk -v a="$phase_start" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}')
  phase_names+=("$phase_name"); phase_secs+=("$secs")
  echo "=== $phase_name: ${secs} s" >&2
}
report() {
  echo "--- timings"
  local i
  for i in "${!phase_names[@]}"; do printf '  %-34s %8s s\n' "${phase_names[$i]}" "${phase_secs[$i]}"; done
}

# ---- podman configuration ---------------------------------------------------------------
begin "configure podman"
mkdir -p "$work/storage" "$work/run" "$work/tmp"
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$work/tmp/events.log"
tmp_dir = "$work/tmp"
EOF
cat >"$work/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
export CONTAINERS_CONF="$work/containers.conf"
export CONTAINERS_STORAGE_CONF="$work/storage.conf"
podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}} {{.Store.GraphDriverName}} {{.Store.GraphRoot}}' >&2
end

# ---- containers: always stopped and removed ---------------------------------------------
tag="pt$$"
containers=()
cleanup() {
  local rc=$?
  if [[ ${#containers[@]} -gt 0 ]]; then
    if [[ $rc -ne 0 ]]; then
      for c in "${containers[@]}"; do
        echo "--- logs of $c" >&2
        timeout 30 podman logs "$c" 2>&1 | tail -n 40 >&2 || true
      done
    fi
    for c in "${containers[@]}"; do
      timeout 60 podman stop -t 2 "$c" >/dev/null 2>&1 || true
      timeout 60 podman rm -f "$c" >/dev/null 2>&1 || true
    done
    echo "stopped and removed: ${containers[*]}" >&2
    containers=()
  fi
  return $rc
}
trap cleanup EXIT

if [[ $run_only -eq 0 ]]; then
  # ---- base image -----------------------------------------------------------------------
  begin "base image (debootstrap + import)"
  if [[ $fresh_base -eq 1 ]] || ! podman image exists "$base"; then
    sources=/etc/apt/sources.list.d/debian.sources
    mirror=$(awk '/^URIs:/ {print $2; exit}' "$sources")
    [[ -n "$mirror" ]] || { echo "no URIs: line in $sources" >&2; exit 1; }
    root="$work/rootfs"
    rm -rf "$root"
    "${low[@]}" timeout 1800 debootstrap --variant=minbase bookworm "$root" "$mirror" \
      >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
    # apt inside the build uses the host's sources and settings (the mirror may be a dated
    # snapshot: Acquire::Check-Valid-Until "false" lives in apt.conf.d).
    rm -f "$root/etc/apt/sources.list"
    cp "$sources" "$root/etc/apt/sources.list.d/debian.sources"
    for f in /etc/apt/apt.conf.d/*; do
      [[ -f "$f" ]] && cp "$f" "$root/etc/apt/apt.conf.d/"
    done
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    timeout 600 podman rmi -f "$base" >/dev/null 2>&1 || true
    tar -C "$root" -c . | "${low[@]}" timeout 900 podman import - "$base" >/dev/null
    rm -rf "$root"
  else
    echo "reusing $base (--fresh-base to rebuild it)" >&2
  fi
  end

  # ---- the image ------------------------------------------------------------------------
  begin "podman build $image"
  cd "$repo"
  set +e
  "${low[@]}" timeout "$build_timeout" podman build --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    --build-arg DEBIAN_IMAGE="$base" \
    -f deploy/container/Dockerfile -t "$image" . >"$work/build.log" 2>&1
  build_rc=$?
  set -e
  grep -E '^(\[[0-9]+/[0-9]+\] )?(STEP|COMMIT)|^Successfully' "$work/build.log" | cut -c1-160 >&2 || true
  [[ $build_rc -eq 0 ]] || { echo "podman build failed (rc $build_rc): $work/build.log" >&2; tail -n 40 "$work/build.log" >&2; exit 1; }
  end
fi

podman image exists "$image" || { echo "no $image: build it first (without --run-only)" >&2; exit 1; }

# ---- the image's programs load all their libraries --------------------------------------
begin "ldd check in the image"
missing=$(timeout 300 podman run --rm --network host "$image" sh -c \
  'ldd /usr/local/bin/pipetrain /usr/local/bin/pipetrain-coordinator /usr/local/bin/pipetrain-worker | grep "not found" || true')
if [[ -n "$missing" ]]; then echo "libraries not found in $image:" >&2; echo "$missing" >&2; exit 1; fi
timeout 300 podman run --rm --network host "$image" pipetrain --version >&2
end

# ---- free ports --------------------------------------------------------------------------
free_port() {
  local p i
  for i in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 20000 ))
    if ! ss -Htln "sport = :$p" | grep -q . && [[ " ${used_ports:-} " != *" $p "* ]]; then
      used_ports="${used_ports:-} $p"; echo "$p"; return 0
    fi
  done
  echo "no free port" >&2; return 1
}
port=$(free_port)
mport=$(free_port)
addr=127.0.0.1:$port
echo "coordinator $addr, metrics 127.0.0.1:$mport" >&2

# ---- coordinator + two workers ----------------------------------------------------------
begin "start coordinator"
containers+=("$tag-coordinator")
timeout 300 podman run -d --name "$tag-coordinator" --network host "$image" \
  pipetrain-coordinator --listen "$addr" --metrics-listen "127.0.0.1:$mport" \
  --db /var/lib/pipetrain/c.db >/dev/null
ok=0
for i in $(seq 1 60); do
  if timeout 20 podman exec "$tag-coordinator" pipetrain health --coordinator "$addr" --timeout 2 >/dev/null 2>&1; then ok=1; break; fi
  sleep 1
done
[[ $ok -eq 1 ]] || { echo "coordinator not serving on $addr after 60 tries" >&2; exit 1; }
end

begin "start two workers"
for w in 1 2; do
  containers+=("$tag-worker$w")
  timeout 300 podman run -d --name "$tag-worker$w" --network host "$image" \
    pipetrain-worker --coordinator "$addr" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 >/dev/null
done
ok=0
for i in $(seq 1 60); do
  n=$(timeout 20 podman exec "$tag-coordinator" pipetrain workers --coordinator "$addr" -o json 2>/dev/null | grep -c . || true)
  if [[ "${n:-0}" -ge 2 ]]; then ok=1; break; fi
  sleep 1
done
[[ $ok -eq 1 ]] || { echo "fewer than 2 workers registered after 60 tries" >&2; exit 1; }
timeout 20 podman exec "$tag-coordinator" pipetrain workers --coordinator "$addr" >&2
curl_metrics=$(timeout 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$mport; printf 'GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n' >&3; cat <&3" 2>/dev/null | grep -c '^pipetrain_' || true)
echo "coordinator /metrics on 127.0.0.1:$mport: ${curl_metrics:-0} pipetrain_ sample lines" >&2
end

# ---- the job -------------------------------------------------------------------------------
begin "submit --follow (2 stages, 20 steps)"
set +e
timeout "$job_timeout" podman run --rm --network host "$image" \
  pipetrain submit --follow --coordinator "$addr" --stages 2 --steps 20 2>&1 | tee "$work/submit.log"
submit_rc=${PIPESTATUS[0]}
set -e
[[ $submit_rc -eq 0 ]] || { echo "submit --follow failed: rc $submit_rc" >&2; exit 1; }
end

begin "stop + rm containers"
trap - EXIT
cleanup
end

report
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "--- image $image: $size bytes ($(awk -v s="$size" 'BEGIN{printf "%.0f MiB", s/1048576}'))"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | sed 's/^/  /'
echo "OK: coordinator + 2 workers from $image trained the job"
