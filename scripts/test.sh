#!/usr/bin/env bash
# Sets up, builds and runs every test (unit and integration) with CTest.
# Extra arguments go to ctest, e.g. scripts/test.sh -R pipeline.
# When tests fail, the output of each failed test is printed once more at the very end
# (the last 80 lines of each), so that a log read from its tail shows why.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
scripts/fuzz.sh --build-only  # the fuzz targets (clang) now, not while other tests run
rc=0
ctest --test-dir build --output-on-failure --timeout 900 -j "$(nproc)" "$@" || rc=$?
if [[ $rc -ne 0 && -s build/Testing/Temporary/LastTestsFailed.log ]]; then
  echo "==== output of the failed tests, once more ===="
  while IFS=: read -r _ name; do
    echo "---- $name"
    # A test's section of LastTest.log runs from its "Testing: NAME" line to "end time".
    awk -v name="$name" '
      $0 ~ /^[0-9]+\/[0-9]+ Testing: / { inside = (substr($0, index($0, ": ") + 2) == name) }
      inside { print }
      inside && index($0, "\"" name "\" end time:") == 1 { inside = 0 }
    ' build/Testing/Temporary/LastTest.log | tail -n 80
  done < build/Testing/Temporary/LastTestsFailed.log
fi
exit $rc
