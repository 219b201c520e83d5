#!/usr/bin/env bash
# bench/dion_bench.sh — the whole benchmark in one command; writes the markdown of the
# tables of docs/benchmarks.md (one section per table, pasted into that page by hand) to stdout.
#
#   bench/dion_bench.sh [--quick] [--no-compiled]     # build dir: $DION_BUILD_DIR (build/)
#
# Runs, one thread each, in this order: dion-bench ortho --check (bf16 and fp32), dion-bench
# step, dion-bench micro, dion-bench dist (the distributed step at 1, 2, 4 ranks and the cost
# model's calibration), then bench/reference_step.py (microsoft/dion eager and, unless
# --no-compiled, compiled, next to dion_cpp's exact and fast paths in one Python process) and
# bench/reference_train.py (dion-train's tokens/s against the reference's GPT model, eager),
# bench/train_speed.py (dion-train's forward + backward against the reference's GPT eager and
# compiled, fp32 and bf16, two sizes, peak memory), then bench/bench_report.py over all the tables and scripts/cost_model.py check --bench (the
# model's bytes and time against the dist table).
# The reference: a checkout at $DION_REF (or on PYTHONPATH); without one, its files are taken
# from the bare git mirror $DION_REF_GIT (default /work/.mirror/microsoft+dion/repo) into a
# temporary folder for the run and removed after (never committed). Without either, the
# reference rows say so. Raw tables: $DION_BENCH_JSON (default <build dir>/dion_bench.jsonl,
# overwritten). --quick: small shapes, one parameter set, 1 and 2 ranks on a tiny set, a short
# trainer run: a smoke run of a few minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${DION_BUILD_DIR:-build}
JSON=${DION_BENCH_JSON:-$BUILD/dion_bench.jsonl}
PYTHON=${PYTHON:-python3}
QUICK=0 COMPILED=--compiled
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    --no-compiled) COMPILED= ;;
    *) echo "dion_bench.sh: unknown argument '$a' (valid: --quick, --no-compiled)" >&2; exit 2 ;;
  esac
done
cmake --build "$BUILD" --target dion-bench dion-train dion-data dion_python -j"${DION_BENCH_JOBS:-2}" >&2
BIN=$BUILD/dion-bench
source "$ROOT/scripts/tiny_shards.sh"  # $WORK (removed at exit) with Tiny Shakespeare shards
tiny_shards "$BUILD" dion_bench

REF_PATH=${DION_REF:-}
REF_GIT=${DION_REF_GIT:-/work/.mirror/microsoft+dion/repo}
if [ -z "$REF_PATH" ] && git -C "$REF_GIT" rev-parse HEAD > /dev/null 2>&1; then
  REF_PATH=$WORK/dion_ref
  mkdir -p "$REF_PATH"
  git -C "$REF_GIT" archive HEAD dion models | tar -x -C "$REF_PATH"
  export DION_REF_COMMIT=$(git -C "$REF_GIT" rev-parse HEAD)
fi

: > "$JSON"
if [ "$QUICK" = 1 ]; then
  "$BIN" --json "$JSON" ortho --check --shapes 512x512x4,256x1024x1 --reps 3 >&2
  "$BIN" --json "$JSON" step --sets 256x2 --reps 2 >&2
  "$BIN" --json "$JSON" micro --sizes 256,512 --reps 2 >&2
  "$BIN" --json "$JSON" dist --ranks 1,2 --sets 64x2 --reps 2 >&2
  SETS=256x2 TRAIN=(--optimizers muon --steps 2 --warmup 1)
  SPEED=(--sizes 2x128 --dtypes fp32 --rounds 1 --steps 1 --no-memory)
else
  "$BIN" --json "$JSON" ortho --check --dtypes bf16,fp32 --reps 3 >&2
  "$BIN" --json "$JSON" step --reps 3 >&2
  "$BIN" --json "$JSON" micro --reps 3 >&2
  "$BIN" --json "$JSON" dist --reps 5 >&2
  SETS=768x2,256x4 TRAIN=(--steps 5 --warmup 2)
  SPEED=(--rounds 3 --steps 3)
fi
export PYTHONPATH="$BUILD/python${REF_PATH:+:$REF_PATH}${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" bench/reference_step.py --sets "$SETS" --reps 3 $COMPILED --json "$JSON" >&2
"$PYTHON" bench/reference_train.py --dion-train "$BUILD/dion-train" --data-dir "$WORK/shards" "${TRAIN[@]}" \
  --json "$JSON" >&2
"$PYTHON" bench/train_speed.py --dion-train "$BUILD/dion-train" --data-dir "$WORK/shards" "${SPEED[@]}" \
  --json "$JSON" --markdown "$WORK/train_speed.md" >&2
"$PYTHON" bench/bench_report.py "$JSON"
echo "### Forward + backward against the reference eager and compiled (\`bench/train_speed.py\`)"
echo
cat "$WORK/train_speed.md"
echo
echo "### Cost model against the distributed runs (\`scripts/cost_model.py check --bench\`)"
echo
"$PYTHON" scripts/cost_model.py check --bench "$JSON" --markdown
