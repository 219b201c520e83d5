#!/usr/bin/env bash
# dion-cpp test command: setup (idempotent), then every test through ctest, then the skip check
# (scripts/check_skips.py: a skip for any reason tests/allowed_skips.txt does not list fails the
# command), then the data library under ASan+UBSan and its fuzz targets (scripts/sanitize.sh;
# DION_SKIP_SANITIZE=1 leaves that job out). Arguments go to ctest (e.g. -R exact).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
scripts/setup.sh
BUILD_DIR=${DION_BUILD_DIR:-$ROOT/build}
junit=$BUILD_DIR/ctest-junit.xml
rm -f "$junit"
rc=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --output-junit "$junit" \
   --test-output-size-passed 1000000 "$@") || rc=$?
python3 "$ROOT/scripts/check_skips.py" "$junit" || rc=1
[ "$rc" -eq 0 ] || { echo "[test] FAILED (ctest or the skip check above)"; exit "$rc"; }
[ "${DION_SKIP_SANITIZE:-0}" = "1" ] || scripts/sanitize.sh
