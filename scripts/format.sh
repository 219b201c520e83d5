#!/usr/bin/env bash
# scripts/format.sh — clang-format (.clang-format) over the project's C++ and CUDA sources.
#
#   scripts/format.sh            format in place
#   scripts/format.sh --check    list the files that are not formatted; exit 1 if any
#   scripts/format.sh FILE...    format (or, with --check first, check) only these
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
command -v clang-format > /dev/null || { echo "format: clang-format not found (apt-get install clang-format)"; exit 2; }
if [ "$#" -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files 'src/*' 'include/*' 'tools/*' 'python/*' 'tests/*' 'bench/*' 'examples/*' |
                       grep -E '\.(cpp|h|cu|cuh)$')
fi
bad=0
for f in "${files[@]}"; do
  if [ "$check" = 1 ]; then
    clang-format "$f" | cmp -s - "$f" || { echo "$f"; bad=1; }
  else
    clang-format -i "$f"
  fi
done
exit "$bad"
