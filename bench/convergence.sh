#!/usr/bin/env bash
# bench/convergence.sh — the convergence benchmark (bench/convergence.py, docs/convergence.md):
# builds dion-train and dion-data, then runs every optimizer's learning-rate sweep and seeds on
# byte-level Tiny Shakespeare and writes OUT/report.md and the two PNGs.
#
#   bench/convergence.sh            # full: 43 minutes on two cores (docs/convergence.md)
#   bench/convergence.sh --quick    # under 10 minutes (4 on a quiet machine)
#   bench/convergence.sh --smoke    # the plumbing only (what ctest convergence_smoke runs)
#   bench/convergence.sh --out DIR --jobs 2 --optimizers adamw,muon
#   bench/convergence.sh --width [--quick | --smoke]   # the width study (bench/width_study.py):
#                                   # widths 128, 256, 512; docs/convergence.md "Width study"
#   bench/convergence.sh --moe [--smoke]   # MoE vs dense of the same active parameters
#                                   # (bench/moe_convergence.py; reuses the width study's dense runs)
#
# Build folder: $DION_BUILD_DIR (default build/). Every other argument goes to convergence.py
# (width_study.py after --width, moe_convergence.py after --moe).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${DION_BUILD_DIR:-build}
PYTHON=${PYTHON:-python3}
if [ "${DION_CONVERGENCE_NO_BUILD:-0}" != 1 ]; then
  cmake --build "$BUILD" --target dion-train dion-data -j"${DION_BENCH_JOBS:-2}" >&2
fi
SCRIPT=bench/convergence.py
if [ "${1:-}" = "--width" ]; then SCRIPT=bench/width_study.py; shift; fi
if [ "${1:-}" = "--moe" ]; then SCRIPT=bench/moe_convergence.py; shift; fi
exec "$PYTHON" "$SCRIPT" --build "$BUILD" "$@"
