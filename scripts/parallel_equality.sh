#!/usr/bin/env bash
# scripts/parallel_equality.sh — the full equality matrix of the parallel layouts (too slow for CI): the same
# tiny GPT, config and global batch trained at every layout, 20 steps on CPU, compared with the
# 1-process run (max relative difference of the train / val losses in metrics.jsonl).
#
#   scripts/parallel_equality.sh [BUILD_DIR] [OPTIMIZER] [KEYS...]   # default: build, muon
#   scripts/parallel_equality.sh build dion2 --ortho_fraction 0.5       # extra keys go to every run
#
# Every optimizer runs at every layout; docs/train.md has the columns for muon, dion2, normuon and
# nordion2 (`scripts/parallel_equality.sh build normuon`).
#
# Layouts: 1 | dp 2 (DDP) | fs 2 (FSDP) | tp 2 | dp 2 x fs 2 (HSDP) | fs 2 x tp 2 | dp 2 x fs 2 x tp 2
# (8 processes). Ranks get torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
# no launcher needed. Results: docs/train.md "Parallel layouts".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
OPT=${2:-muon}
shift $(( $# < 2 ? $# : 2 ))
EXTRA=("$@")
EXE=$BUILD/dion-train
source "$ROOT/scripts/tiny_shards.sh"
tiny_shards "$BUILD" dion_parallel_eq
ARGS=(--data_dir "$WORK/shards" --model_dim 64 --n_layer 2 --n_head 2 --sequence_length 64 --batch_size 8
      --device_batch_size 1 --val_tokens 1024 --val_loss_every 10 --num_iterations 20 --warmup_ratio 0
      --dtype fp32 --optimizer "$OPT" --scalar_opt adamw --lr 0.02 --log_every 100 --comm_timeout_s 120
      "${EXTRA[@]}")

run() {  # run NAME DP FS TP
  local name=$1 dp=$2 fs=$3 tp=$4 n=$(($2 * $3 * $4)) port=$((20000 + RANDOM % 20000)) pids=() r
  for ((r = 0; r < n; r++)); do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      "$EXE" "${ARGS[@]}" --dp_size "$dp" --fs_size "$fs" --tp_size "$tp" --run_dir "$WORK/$name" \
      > "$WORK/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || { echo "$name failed:"; cat "$WORK/$name".rank*.log; exit 1; }; done
  grep -h "^memory" "$WORK/$name.rank0.log" | sed "s/^/  $name: /"
}
run one 1 1 1
run ddp2 2 1 1
run fsdp2 1 2 1
run tp2 1 1 2
run hsdp2x2 2 2 1
run fsdp2xtp2 1 2 2
run dp2xfs2xtp2 2 2 2
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
def losses(name):
    return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl"))]
ref = losses("one")
print(f"{'layout':<14} {'step 0':>9} {'step 1':>9} {'max (20 steps + val)':>21}")
for name in ["ddp2", "fsdp2", "tp2", "hsdp2x2", "fsdp2xtp2", "dp2xfs2xtp2"]:
    got = losses(name)
    assert [g[:2] for g in got] == [r[:2] for r in ref], name
    rel = [abs(g[2] - r[2]) / abs(r[2]) for g, r in zip(got, ref)]
    print(f"{name:<14} {rel[0]:>9.1e} {rel[1]:>9.1e} {max(rel):>21.1e}")
PY
