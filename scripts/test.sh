#!/usr/bin/env bash
# dion-cpp test command: setup (idempotent), then every test through ctest, then the data
# library under ASan+UBSan and its fuzz targets (scripts/sanitize.sh; DION_SKIP_SANITIZE=1 skips).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
cd - >/dev/null
[ "${DION_SKIP_SANITIZE:-0}" = "1" ] || scripts/sanitize.sh
