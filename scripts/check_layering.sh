#!/usr/bin/env bash
# Checks the include rules of docs/design.md ("Folders"): runtime/ includes no gRPC, and of
# protobuf only runtime/job/ includes headers (the job spec's messages and protobuf's
# reflection over them). Prints every file that breaks a rule and exits 1; exit 0 if none.
#   scripts/check_layering.sh [ROOT]     ROOT: the source tree (default: this checkout)
set -uo pipefail
root=${1:-"$(dirname "$0")/.."}
cd "$root" || exit 2
[[ -d runtime ]] || { echo "check_layering: no runtime/ under $root" >&2; exit 2; }
status=0
grpc=$(grep -rlE '^\s*#\s*include\s*[<"](grpc|grpcpp)/' runtime --include='*.h' --include='*.cc')
if [[ -n "$grpc" ]]; then
  echo "runtime/ includes gRPC (it must not):"; echo "$grpc" | sed 's/^/  /'; status=1
fi
protobuf=$(grep -rlE '^\s*#\s*include\s*[<"](google/protobuf/|[^>"]*\.pb\.h)' runtime \
             --include='*.h' --include='*.cc' | grep -v '^runtime/job/')
if [[ -n "$protobuf" ]]; then
  echo "protobuf included outside runtime/job/:"; echo "$protobuf" | sed 's/^/  /'; status=1
fi
[[ $status -eq 0 ]] && echo "ok: runtime/ has no gRPC; protobuf only in runtime/job/"
exit $status
