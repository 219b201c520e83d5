#!/usr/bin/env bash
# scripts/device_check.sh — the one-shot GPU check, for a session lent a GPU machine
# (one H200, no network, ~15 minutes of device time in all: this must finish in < 7 minutes so that a
# second run fits; the own-kernel rows add an estimated minute, not yet timed on a GPU).
#
#   scripts/device_check.sh                       # on the GPU machine, from the repo root
#   scripts/device_check.sh --device cpu --quick  # the same plumbing on a CPU, in about a minute
#   scripts/device_check.sh --reference DIR       # also the reference's rows (or DION_REFERENCE_DIR;
#                                                 # DIR relative to the repository root)
#
# 1. builds only what it runs (test_cuda, device_bench, dion-train, dion-data; ccache) in
#    DION_BUILD_DIR (default build/), configured as scripts/setup.sh does;
# 2. runs the GPU tests (tests/cuda/test_cuda.cpp; they skip without a GPU): the project's own CUDA
#    kernels against ATen (the tests turn them on), the optimizers with them off (the default:
#    ATen's CUDA ops) and on, and a default step that must launch none of them;
# 3. measures (bench/device_bench.cpp): the bf16 matmul peak, orthogonalization TFLOP/s on the
#    160M model's matrix set against it (exact path; fast path with full and with symmetric
#    products), the symmetric products alone per block height, the optimizer step per algorithm;
#    the rows the own kernels change twice (--cuda-kernels both: ATen's ops, then "own kernels");
#    with --reference DIR (a checkout of microsoft/dion, carried along; never committed here),
#    the reference on the same shapes (bench/device_reference.py: its Triton and torch
#    orthogonalizers, its optimizer step per class; at most 3 minutes, DION_REFERENCE_TIMEOUT);
# 4. trains the 160M model (configs/dion2_160m.yaml; batch 16 x 1024 tokens) for 50 steps on
#    Tiny Shakespeare, eagerly, with cuda_graphs: true (the training step replayed from CUDA
#    graphs) and with cuda_kernels: true (the own kernels; both CUDA only), and with an MoE
#    feed-forward (8 experts, top_k 2, one shared; one process, so no all_to_all): tokens/s and the
#    MFU its step lines print (dion/train/mfu.h:
#    (6 N + 12 L T C) x tokens/s against the measured matmul peak, given as peak_tflops);
# then prints one markdown table. Logs and the table go to $OUT (the device machine's output
# folder), else DION_BUILD_DIR/device_check/. A step that fails is named under the table and
# the rest still run; exit status 1 if any step or the GPU tests failed, else 0 (the
# measurements have no thresholds).
# --quick: every dimension / 8 and a tiny model for 5 steps: checks the script, not the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEVICE=cuda
QUICK=0
REFERENCE=${DION_REFERENCE_DIR:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=${2:-}; shift 2 ;;
    --device=*) DEVICE=${1#*=}; shift ;;
    --quick) QUICK=1; shift ;;
    --reference) REFERENCE=${2:-}; shift 2 ;;
    --reference=*) REFERENCE=${1#*=}; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "device_check.sh: unknown argument '$1' (--device cuda|cpu, --quick, --reference DIR)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "device_check.sh: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac
if [ -n "$REFERENCE" ] && [ ! -f "$REFERENCE/dion/__init__.py" ]; then
  echo "device_check.sh: --reference '$REFERENCE' holds no dion/__init__.py (expected a checkout of microsoft/dion)" >&2
  exit 2
fi
BUILD_DIR=${DION_BUILD_DIR:-$ROOT/build}
OUT=${OUT:-$BUILD_DIR/device_check}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
start=$(date +%s)
log() { printf '[device_check %3ds] %s\n' "$(( $(date +%s) - start ))" "$*" | tee -a "$OUT/device_check.log"; }

# ---------------------------------------------------------------------------- machine
{
  date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  lscpu | sed -n 's/^Model name: *//p' | head -1
  echo "$(nproc) cores; torch $($PYTHON -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
} > "$OUT/machine.txt"
log "machine: $(tr '\n' ';' < "$OUT/machine.txt")"

# ---------------------------------------------------------------------------- build
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  # Configured as scripts/setup.sh does, without its package installs (the machine is offline).
  extra=()
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then  # setup.sh's nvcc
    for n in "$HOME"/.cache/dion-cuda-*/nvidia/cu*/bin/nvcc; do
      if [ -x "$n" ]; then extra=(-DCMAKE_CUDA_COMPILER="$n"); fi
    done
  fi
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$($PYTHON -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    -DPython3_EXECUTABLE="$(command -v "$PYTHON")" "${extra[@]}" > "$OUT/configure.log" 2>&1 ||
    { tail -30 "$OUT/configure.log"; log "configure FAILED"; exit 1; }
fi
log "building test_cuda device_bench dion-train dion-data (log: build.log)"
cmake --build "$BUILD_DIR" -j "$(nproc)" --target test_cuda device_bench dion-train dion-data > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; log "build FAILED"; exit 1; }
cuda_built=$(grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' "$BUILD_DIR/CMakeCache.txt" && echo yes || echo no)
log "built; CUDA kernels compiled: $cuda_built"

# ---------------------------------------------------------------------------- GPU tests
tests_status=0
"$BUILD_DIR/tests/test_cuda" > "$OUT/test_cuda.log" 2>&1 || tests_status=1
count() { sed -n "s/^\[  *$1  *\] \([0-9][0-9]*\) tests*[,.].*/\1/p" "$OUT/test_cuda.log" | head -1; }
n_pass=$(count PASSED); n_skip=$(count SKIPPED); n_fail=$(count FAILED)
tests_summary="${n_pass:-0} passed, ${n_skip:-0} skipped, ${n_fail:-0} failed"
log "test_cuda: ${tests_summary:-see test_cuda.log} (exit $tests_status)"

# ---------------------------------------------------------------------------- measurements
bench_args=(--device "$DEVICE" --cuda-kernels both)
[ "$QUICK" = 1 ] && bench_args+=(--quick --reps 2)
log "device_bench ${bench_args[*]} (log: device_bench.md)"
failed=()  # steps that failed: reported in the table, and the exit status is 1
"$BUILD_DIR/bench/device_bench" "${bench_args[@]}" > "$OUT/device_bench.md" 2> "$OUT/device_bench.err" ||
  { tail -5 "$OUT/device_bench.err"; log "device_bench FAILED (rows so far kept)"; failed+=(device_bench); }
peak_tflops=$(sed -n 's/^| matmul peak[^|]*| \([0-9.e+-]*\) TFLOP\/s.*/\1/p' "$OUT/device_bench.md")

# ---------------------------------------------------------------------------- the reference
: > "$OUT/device_reference.md"
if [ -n "$REFERENCE" ]; then
  ref_args=(--reference "$REFERENCE" --device "$DEVICE" --autotune "${DION_REFERENCE_AUTOTUNE:-pruned}")
  [ -n "$peak_tflops" ] && ref_args+=(--peak-tflops "$peak_tflops")
  [ "$QUICK" = 1 ] && ref_args+=(--quick --reps 2)
  log "bench/device_reference.py ${ref_args[*]} (log: device_reference.md, device_reference.err)"
  timeout "${DION_REFERENCE_TIMEOUT:-180}" "$PYTHON" bench/device_reference.py "${ref_args[@]}" \
    > "$OUT/device_reference.md" 2> "$OUT/device_reference.err" ||
    { tail -5 "$OUT/device_reference.err"; log "device_reference FAILED or timed out (rows so far kept)"; failed+=(device_reference); }
fi

# ---------------------------------------------------------------------------- dion-train
DATA=$OUT/shakespeare
if ! compgen -G "$DATA/fineweb_train_*.bin" > /dev/null; then
  "$BUILD_DIR/dion-data" prepare data/tinyshakespeare/input.txt -o "$DATA" --shard-size 32768 \
    --tokenizer data/gpt2 --overwrite -q > "$OUT/prepare.log" 2>&1 || { log "dion-data prepare FAILED"; failed+=(prepare); }
fi
if [ "$QUICK" = 1 ]; then
  train_args=(--model_dim 64 --n_layer 2 --n_head 2 --sequence_length 64 --batch_size 4 --device_batch_size 4
              --val_tokens 256 --num_iterations 5)
  steps=5
else
  train_args=(--batch_size 16 --device_batch_size 16 --val_tokens 16384 --num_iterations 50)
  steps=50
fi
# The mean of one field of the step lines after the first 5 (warm-up; capture), or of all when fewer.
mean_of() {  # mean_of LOG REGEX FORMAT (the number is the first one the regex's match holds)
  { grep -o "$2" "$1" || true; } | grep -o '[0-9][0-9.]*' |
    awk -v f="$3" '{v[NR]=$1} END {s=0; n=0; from=(NR>10?6:1); for(i=from;i<=NR;i++){s+=v[i]; n++} if(n) printf f, s/n}'
}
peak_arg=()
[ -n "$peak_tflops" ] && peak_arg=(--peak_tflops "$peak_tflops")
train_row() {  # train_row NAME GRAPHS KERNELS [KEY VALUE...]: sets toks_NAME, mfu_NAME (log: train_NAME.log)
  local name=$1 graphs=$2 kernels=$3 log_file="$OUT/train_$1.log"
  shift 3
  log "dion-train: configs/dion2_160m.yaml $* on $DEVICE, cuda_graphs $graphs, cuda_kernels $kernels, $steps steps (log: train_$name.log)"
  rm -rf "$OUT/train_$name"
  "$BUILD_DIR/dion-train" --config configs/dion2_160m.yaml --data_dir "$DATA" --device "$DEVICE" \
    --run_dir "$OUT/train_$name" --checkpoint_freq 0 --val_loss_every 0 --log_every 1 --cuda_graphs "$graphs" \
    --cuda_kernels "$kernels" "${peak_arg[@]}" "${train_args[@]}" "$@" > "$log_file" 2>&1 ||
    { tail -10 "$log_file"; log "dion-train (cuda_graphs $graphs, cuda_kernels $kernels) FAILED"; failed+=("dion-train-$name"); }
  [ "$name" = eager ] && params=$(sed -n 's/.*, \([0-9]*\) parameters;.*/\1/p' "$log_file" | head -1)
  printf -v "toks_$name" '%s' "$(mean_of "$log_file" '| [0-9]* tok/s' %.0f)"
  printf -v "mfu_$name" '%s' "$(mean_of "$log_file" '| MFU [0-9.]*%' %.1f)"
}
train_row eager false false
# The mixture of experts (routing, bincount, per-expert GEMMs, balance loss) on the device, one process.
moe_args=(--n_experts 8 --top_k 2 --n_shared_experts 1 --router_opt matrix --moe_aux_loss_coef 0.01)
train_row moe false false "${moe_args[@]}"
if [ "$DEVICE" = cuda ]; then
  train_row graphs true false
  train_row kernels false true
fi

# ---------------------------------------------------------------------------- the table
{
  echo "Device check, $(head -1 "$OUT/machine.txt"): $(sed -n 2p "$OUT/machine.txt"); $(sed -n 4p "$OUT/machine.txt")"
  echo "device $DEVICE$([ "$QUICK" = 1 ] && echo ', --quick (dimensions / 8, tiny model: plumbing only)'); CUDA kernels compiled: $cuda_built; test_cuda: ${tests_summary:-?}"
  echo
  echo "| measurement | value | / matmul peak |"
  echo "|---|---|---|"
  cat "$OUT/device_bench.md" "$OUT/device_reference.md"
  model="dion-train dion2 160M$([ "$QUICK" = 1 ] && echo ' (quick: tiny model)'), $steps steps, ${params:-?} parameters"
  echo "| $model | ${toks_eager:-?} tokens/s | MFU ${mfu_eager:-?}% |"
  echo "| $model, MoE 8 experts top_k 2 (+1 shared) | ${toks_moe:-?} tokens/s | MFU ${mfu_moe:-?}% (active) |"
  if [ "$DEVICE" = cuda ]; then
    echo "| $model, cuda_graphs: true | ${toks_graphs:-?} tokens/s | MFU ${mfu_graphs:-?}% |"
    echo "| $model, cuda_kernels: true | ${toks_kernels:-?} tokens/s | MFU ${mfu_kernels:-?}% |"
  else
    echo "| $model, cuda_graphs: true | n/a (cuda_graphs needs device cuda) | n/a |"
    echo "| $model, cuda_kernels: true | n/a (cuda_kernels needs device cuda) | n/a |"
  fi
  [ ${#failed[@]} -eq 0 ] || echo "FAILED: ${failed[*]} (logs in $OUT)"
} > "$OUT/table.md"
echo
cat "$OUT/table.md"
log "done in $(( $(date +%s) - start )) s; logs in $OUT"
[ ${#failed[@]} -eq 0 ] || exit 1
exit "$tests_status"
