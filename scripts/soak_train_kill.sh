#!/usr/bin/env bash
# scripts/soak_train_kill.sh — kill -9 a random rank of a parallel dion-train at a random moment
# while it checkpoints every step, N times (default 20); after each kill the newest checkpoint
# must resume (at 1 process: a different layout, so resharding is exercised too).
# CI runs one such kill (tests/train/test_parallel.cpp, KillDashNineDuringSaves...).
#
#   scripts/soak_train_kill.sh [BUILD_DIR] [N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
N=${2:-20}
EXE=$BUILD/dion-train
source "$ROOT/scripts/tiny_shards.sh"
tiny_shards "$BUILD" dion_soak_train_kill
ARGS=(--data_dir "$WORK/shards" --model_dim 64 --n_layer 2 --n_head 2 --sequence_length 64 --batch_size 4
      --device_batch_size 1 --val_tokens 256 --val_loss_every 0 --num_iterations 40 --warmup_ratio 0
      --dtype fp32 --optimizer muon --scalar_opt adamw --log_every 100 --comm_timeout_s 20)
ok=0
for ((i = 1; i <= N; i++)); do
  CK=$WORK/ck$i
  port=$((20000 + RANDOM % 20000)) pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      "$EXE" "${ARGS[@]}" --fs_size 2 --checkpoint_dir "$CK" --checkpoint_freq 1 --run_dir "$WORK/run$i" \
      > "$WORK/run$i.rank$r.log" 2>&1 &
    pids+=($!)
  done
  until ls -d "$CK"/step_* > /dev/null 2>&1; do sleep 0.05; done  # the first checkpoint exists
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  victim=$((RANDOM % 2))
  kill -9 "${pids[$victim]}" 2> /dev/null || true
  other=$((1 - victim)); t0=$(date +%s)
  wait "${pids[$other]}" && code=0 || code=$?
  wait "${pids[$victim]}" 2> /dev/null || true
  latest=$(ls -d "$CK"/step_* | tail -1)
  if "$EXE" "${ARGS[@]}" --checkpoint_dir "$CK" --stop_after 1 --run_dir "$WORK/resume$i" > "$WORK/resume$i.log" 2>&1 \
     && grep -q "resumed from" "$WORK/resume$i.log"; then
    ok=$((ok + 1)); verdict=resumed
  else
    verdict="RESUME FAILED"; cat "$WORK/resume$i.log"
  fi
  echo "kill $i: rank $victim killed; rank $other exited $code after $(( $(date +%s) - t0 )) s; newest $(basename "$latest"): $verdict"
done
echo "$ok of $N kills left a checkpoint that resumed"
[ "$ok" = "$N" ]
