#!/usr/bin/env bash
# Formats the C++ sources (every tracked .cc, .h and .cu) with clang-format and the
# repository's .clang-format (Google's style at 100 columns).
#   scripts/format.sh                 rewrite the files in place
#   scripts/format.sh --check         change nothing: list the files that differ, exit 1 if any
#   scripts/format.sh --check FILES   the same for FILES only
# Exit 2 when no clang-format is installed (scripts/setup.sh installs clang-format-14).
set -euo pipefail
check=0
files=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) check=1; shift ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) files+=("$(realpath -m "$1")"); shift ;;  # named from where the script was called
  esac
done
cd "$(dirname "$0")/.."
format=""
for candidate in clang-format-14 clang-format; do
  if command -v "$candidate" >/dev/null; then format=$candidate; break; fi
done
if [[ -z "$format" ]]; then
  echo "format.sh: clang-format is not installed (scripts/setup.sh installs clang-format-14)" >&2
  exit 2
fi
if [[ ${#files[@]} -eq 0 ]]; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu')
fi
if [[ $check -eq 0 ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$format" -i --style=file
  exit 0
fi
differ=0
for f in "${files[@]}"; do
  # --style=file finds the .clang-format above the file, as the in-place run does.
  if ! "$format" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "$f"
    differ=1
  fi
done
if [[ $differ -ne 0 ]]; then
  echo "format.sh: the files above differ from .clang-format; scripts/format.sh rewrites them" >&2
fi
exit $differ
