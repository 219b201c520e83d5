#!/usr/bin/env bash
# GPU check, for a session that is lent a GPU machine (one H200): builds what the GPU tests
# need with CUDA kernels (sm_90) and runs them. Prints the device, then the tests; exits with
# their status. About 5 minutes of build on 16 cores; the tests take seconds.
#
#   scripts/device_check.sh          # on the GPU machine, from the repo root
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
scripts/setup.sh >/dev/null   # installs, configures, builds (CUDA kernels when nvcc is found)
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
"$BUILD_DIR/tests/test_cuda" --gtest_brief=0
