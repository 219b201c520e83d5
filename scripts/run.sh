#!/usr/bin/env bash
# dion-cpp main job: setup (idempotent), then the first program a user runs: a small MLP trained
# with a Dion2 group for its matrices and an AdamW group for its biases. Extra arguments go to
# the example (e.g. --algorithm muon --steps 100).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
exec "$BUILD_DIR/examples/train_mlp" "$@"
