#!/usr/bin/env bash
# The negative control of sources_follow_clang_format: scripts/format.sh --check names a
# misformatted file and exits 1, and passes the same file once formatted.
set -uo pipefail
source_dir=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$source_dir/.clang-format" "$work/"
printf 'int  main( ) {return 0 ;}\n' > "$work/misformatted.cc"
out=$("$source_dir/scripts/format.sh" --check "$work/misformatted.cc" 2>&1); rc=$?
if [[ $rc -ne 1 || "$out" != *misformatted.cc* ]]; then
  echo "expected exit 1 naming misformatted.cc; got $rc: $out"; exit 1
fi
"$source_dir/scripts/format.sh" "$work/misformatted.cc" || exit 1
out=$("$source_dir/scripts/format.sh" --check "$work/misformatted.cc" 2>&1); rc=$?
if [[ $rc -ne 0 ]]; then echo "expected exit 0 once formatted; got $rc: $out"; exit 1; fi
echo "ok: a misformatted file is named (exit 1) and passes once formatted"
