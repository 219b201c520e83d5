#!/usr/bin/env bash
# dion-cpp setup: installs every system and Python dependency on a fresh Debian 12 machine,
# then configures and builds. Idempotent: a second run checks, finds everything present, and
# only rebuilds what changed.
#
#   scripts/setup.sh            # install + configure + build (build/)
#   DION_SKIP_BUILD=1 scripts/setup.sh   # install only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${DION_BUILD_DIR:-$ROOT/build}

log() { printf '[setup] %s\n' "$*"; }

# ---------------------------------------------------------------------------- system packages
APT_PKGS=(build-essential cmake ninja-build ccache pkg-config git
          libgtest-dev libgmock-dev libbenchmark-dev
          libyaml-cpp-dev libfmt-dev zlib1g-dev nlohmann-json3-dev libcli11-dev
          libcurl4-openssl-dev libpcre2-dev libgloo-dev
          clang libclang-rt-14-dev  # clang + its sanitizer/libFuzzer runtimes: scripts/sanitize.sh
          qemu-user)  # CPU kinds this machine is not, emulated: tests/scripts/emulated_cpu_kinds.sh
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
else
  log "system packages present"
fi

# ---------------------------------------------------------------------------- python packages
PYTHON=${PYTHON:-python3}
want_torch=$(sed -n 's/^torch==\(.*\)$/\1/p' requirements.txt)
have_torch=$($PYTHON -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ "$have_torch" != "$want_torch" ] || ! $PYTHON -c 'import numpy, pytest, safetensors, matplotlib, yaml, tensorboard, scikit_build_core' 2>/dev/null; then
  log "installing python packages (torch $want_torch is a multi-GB CUDA wheel; first time only)"
  $PYTHON -m pip install -q -r requirements.txt
else
  log "python packages present (torch $have_torch)"
fi

# ---------------------------------------------------------------------------- nvcc
# The CUDA kernels (src/cuda) are compiled and linked whenever torch has CUDA and nvcc is found,
# GPU or not (CI compiles the CUDA variant on every run). A fresh machine has no nvcc: install
# the CUDA compiler from NVIDIA's wheels for torch's CUDA version (nvcc, its front end crt, nvvm,
# the runtime headers, cccl, culibos: about 150 MB, once) into DION_CUDA_DIR.
CUDA_CMAKE_ARGS=()
torch_cuda=$($PYTHON -c 'import torch; print(torch.version.cuda or "")')
if [ -n "$torch_cuda" ] && ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_DIR=${DION_CUDA_DIR:-$HOME/.cache/dion-cuda-$torch_cuda}
  if [ ! -x "$CUDA_DIR/nvidia/cu${torch_cuda%%.*}/bin/nvcc" ]; then
    log "installing nvcc for CUDA $torch_cuda into $CUDA_DIR (NVIDIA's wheels)"
    v="==$torch_cuda.*"
    $PYTHON -m pip install -q --no-deps --target "$CUDA_DIR" "nvidia-cuda-nvcc$v" "nvidia-cuda-crt$v" \
      "nvidia-nvvm$v" "nvidia-cuda-runtime$v" "nvidia-cuda-cccl$v" "nvidia-cuda-culibos$v"
    ln -sfn lib "$CUDA_DIR/nvidia/cu${torch_cuda%%.*}/lib64"
  fi
  CUDA_CMAKE_ARGS=(-DCMAKE_CUDA_COMPILER="$CUDA_DIR/nvidia/cu${torch_cuda%%.*}/bin/nvcc")
fi

[ "${DION_SKIP_BUILD:-0}" = "1" ] && exit 0

# ---------------------------------------------------------------------------- configure + build
TORCH_PREFIX=$($PYTHON -c 'import torch; print(torch.utils.cmake_prefix_path)')
# ccache: paths relative to the checkout, and precompiled headers cacheable, so that a second
# build directory beside build/ (ctest pip_wheel's build-wheel/) reuses build/'s objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring $BUILD_DIR"
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=${DION_BUILD_TYPE:-Release} \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    -DPython3_EXECUTABLE="$(command -v $PYTHON)" "${CUDA_CMAKE_ARGS[@]}"
fi
grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' "$BUILD_DIR/CMakeCache.txt" &&
  log "CUDA kernels: compiled ($(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt"))" ||
  log "CUDA kernels: NOT compiled (torch without CUDA, or no nvcc)"
log "building (ninja, $(nproc) jobs)"
cmake --build "$BUILD_DIR" -j "$(nproc)"
log "done: binaries in $BUILD_DIR"
