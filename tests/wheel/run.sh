#!/usr/bin/env bash
# tests/wheel/run.sh — ctest `pip_wheel`: build the dion_cpp wheel as a user would, install it in
# a fresh venv, and check that it imports and steps like the build tree's module.
#
#   tests/wheel/run.sh SOURCE_DIR BUILD_DIR WORK_DIR WHEEL_BUILD_DIR PYTHON
#
#   1. venv A (--system-site-packages: torch and scikit-build-core from the system):
#      `pip wheel SOURCE --no-build-isolation` with scikit-build-core's site-packages search off,
#      so torch is found only by asking Python (cmake/DionFindTorch.cmake) — the path that a venv
#      whose own site-packages lack torch takes;
#   2. venv B, fresh (--system-site-packages for torch): `pip install --no-index` the wheel (its
#      torch requirement must be met by the torch present: nothing may be downloaded);
#   3. tests/wheel/smoke.py: one Muon step with BUILD_DIR/python's module (saved), then with
#      venv B's (imported from venv B, equal bit for bit).
# WHEEL_BUILD_DIR persists between runs (incremental); ccache hits build/'s objects when
# CCACHE_BASEDIR covers both and the compiler is the same (ctest sets both).
set -euo pipefail
SOURCE_DIR=$1 BUILD_DIR=$2 WORK_DIR=$3 WHEEL_BUILD_DIR=$4 PYTHON=$5

step() { printf 'pip_wheel: %s\n' "$*"; }
rm -rf "$WORK_DIR"
mkdir -p "$WORK_DIR"

step "venv A (build), pip wheel --no-build-isolation (build dir $WHEEL_BUILD_DIR)"
"$PYTHON" -m venv --system-site-packages "$WORK_DIR/venv-build"
if ! "$WORK_DIR/venv-build/bin/python" -c "import scikit_build_core" 2>/dev/null; then
  echo "pip_wheel: scikit-build-core is not installed for $PYTHON: pip install -r requirements.txt" >&2
  exit 1
fi
start=$(date +%s)
if ! "$WORK_DIR/venv-build/bin/python" -m pip wheel -v "$SOURCE_DIR" --no-build-isolation --no-deps \
      -w "$WORK_DIR/dist" --config-settings="build-dir=$WHEEL_BUILD_DIR" --config-settings=search.site-packages=false \
      >"$WORK_DIR/wheel.log" 2>&1; then
  tail -n 60 "$WORK_DIR/wheel.log" >&2
  echo "pip_wheel: pip wheel failed (log: $WORK_DIR/wheel.log)" >&2
  exit 1
fi
grep -E "dion: (torch's CMake prefix|LibTorch)" "$WORK_DIR/wheel.log" || true
wheel=$(ls "$WORK_DIR"/dist/dion_cpp-*.whl)
step "built $(basename "$wheel") in $(( $(date +%s) - start )) s"

step "venv B (fresh), pip install --no-index the wheel"
"$PYTHON" -m venv --system-site-packages "$WORK_DIR/venv-run"
"$WORK_DIR/venv-run/bin/python" -m pip install -q --no-index "$wheel"

cd "$WORK_DIR"   # not the source tree: `import dion_cpp` must not find python/dion_cpp
step "smoke: build tree's module"
PYTHONPATH="$BUILD_DIR/python" TORCH_COMPILE_DISABLE=1 \
  "$PYTHON" "$SOURCE_DIR/tests/wheel/smoke.py" --save "$WORK_DIR/step_build.pt"
step "smoke: the installed wheel"
TORCH_COMPILE_DISABLE=1 "$WORK_DIR/venv-run/bin/python" "$SOURCE_DIR/tests/wheel/smoke.py" \
  --compare "$WORK_DIR/step_build.pt" --expect-under "$WORK_DIR/venv-run"
step "passed"
