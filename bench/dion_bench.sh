#!/usr/bin/env bash
# bench/dion_bench.sh — the whole benchmark in one command; writes the markdown of
# docs/benchmarks.md ("Measured by dion-bench") to stdout.
#
#   bench/dion_bench.sh [--quick] [--no-compiled]     # build dir: $DION_BUILD_DIR (build/)
#
# Runs, one thread each, in this order: dion-bench ortho --check (bf16 and fp32), dion-bench
# step, dion-bench micro, then bench/reference_step.py (microsoft/dion eager and, unless
# --no-compiled, compiled, next to dion_cpp's exact and fast paths in one Python process) when
# the reference is importable (PYTHONPATH, or a checkout at $DION_REF), and
# bench/bench_report.py over all the tables. Raw tables: $DION_BENCH_JSON (default
# <build dir>/dion_bench.jsonl, overwritten). --quick: small shapes and one parameter set, for
# a smoke run (a minute or two).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${DION_BUILD_DIR:-build}
JSON=${DION_BENCH_JSON:-$BUILD/dion_bench.jsonl}
PYTHON=${PYTHON:-python3}
QUICK=0 COMPILED=--compiled
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    --no-compiled) COMPILED= ;;
    *) echo "dion_bench.sh: unknown argument '$a' (valid: --quick, --no-compiled)" >&2; exit 2 ;;
  esac
done
cmake --build "$BUILD" --target dion-bench dion_python -j"${DION_BENCH_JOBS:-2}" >&2
BIN=$BUILD/dion-bench
: > "$JSON"
if [ "$QUICK" = 1 ]; then
  "$BIN" --json "$JSON" ortho --check --shapes 512x512x4,256x1024x1 --reps 3 >&2
  "$BIN" --json "$JSON" step --sets 256x2 --reps 2 >&2
  "$BIN" --json "$JSON" micro --sizes 256,512 --reps 2 >&2
  SETS=256x2
else
  "$BIN" --json "$JSON" ortho --check --dtypes bf16,fp32 --reps 3 >&2
  "$BIN" --json "$JSON" step --reps 3 >&2
  "$BIN" --json "$JSON" micro --reps 3 >&2
  SETS=768x2,256x4
fi
REF_PATH=${DION_REF:-}
PYTHONPATH="$BUILD/python${REF_PATH:+:$REF_PATH}${PYTHONPATH:+:$PYTHONPATH}" \
  "$PYTHON" bench/reference_step.py --sets "$SETS" --reps 3 $COMPILED --json "$JSON" >&2
"$PYTHON" bench/bench_report.py "$JSON"
