#!/usr/bin/env bash
# The negative control of runtime_includes_no_grpc: scripts/check_layering.sh names a runtime
# file that includes gRPC and one outside runtime/job/ that includes protobuf (exit 1), and
# passes a tree whose only protobuf include is in runtime/job/.
set -uo pipefail
source_dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/runtime/job" "$work/runtime/pipeline"
printf '#include "pipetrain/v1/job_spec.pb.h"\n' > "$work/runtime/job/spec.cc"
"$source_dir/scripts/check_layering.sh" "$work" >/dev/null || { echo "a clean tree failed"; exit 1; }
printf '#include <grpcpp/grpcpp.h>\n' > "$work/runtime/pipeline/calls.cc"
printf '#include <google/protobuf/message.h>\n' > "$work/runtime/pipeline/reads.h"
out=$("$source_dir/scripts/check_layering.sh" "$work" 2>&1); rc=$?
if [[ $rc -ne 1 || "$out" != *pipeline/calls.cc* || "$out" != *pipeline/reads.h* ]]; then
  echo "expected exit 1 naming calls.cc and reads.h; got $rc: $out"; exit 1
fi
echo "ok: both breaks are named (exit 1); the clean tree passes"
