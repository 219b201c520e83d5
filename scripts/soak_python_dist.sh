#!/usr/bin/env bash
# Soak test of the multi-process Python tests: runs tests/python/test_distributed.py (its
# 2-process job and its 4-process job, over torch's own Gloo groups) and test_qk_clip.py (QK-clip
# at 2 and 4 ranks) N times in a row and reports
# how many runs passed and failed. A hang shows up as a failed run (the test kills a job after
# JOB_TIMEOUT_S; this script kills a run after 10 minutes). CI runs each test once
# (ctest -R python_tests); this loop is for checking that no intermittent hang is left
# (docs/distributed.md records its result).
#
# Usage: scripts/soak_python_dist.sh [N=50]
#   DION_BUILD_DIR   build directory with python/dion_cpp (default: ./build)
#   SOAK_LOG_DIR     where the logs of failed runs are kept (default: a new directory in /tmp)
# Exit status: 0 when every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-50}
if ! [[ "$N" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [N >= 1] (got '$N')" >&2
  exit 2
fi
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
if [ ! -d "$BUILD_DIR/python/dion_cpp" ]; then
  echo "$BUILD_DIR/python/dion_cpp not found: build the target dion_python first (or set DION_BUILD_DIR)" >&2
  exit 2
fi
LOG_DIR=${SOAK_LOG_DIR:-$(mktemp -d /tmp/dion_soak.XXXXXX)}
mkdir -p "$LOG_DIR"
pass=0
fail=0
for i in $(seq 1 "$N"); do
  t0=$(date +%s)
  log="$LOG_DIR/run$i.log"
  if PYTHONPATH="$BUILD_DIR/python" TORCH_COMPILE_DISABLE=1 timeout 600 \
       python3 -m pytest -q -p no:cacheprovider tests/python/test_distributed.py tests/python/test_qk_clip.py >"$log" 2>&1; then
    pass=$((pass + 1))
    rm -f "$log"
    result=pass
  else
    fail=$((fail + 1))
    result="FAIL (log: $log)"
  fi
  echo "run $i/$N: $result in $(( $(date +%s) - t0 )) s (passed $pass, failed $fail)"
done
echo "soak: $pass of $N runs passed, $fail failed"
[ "$fail" -eq 0 ]
