#!/usr/bin/env bash
# dion-cpp test command: setup (idempotent), then every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
