#!/usr/bin/env bash
# scripts/soak_train_diskfull.sh — fill the disk under a checkpointing dion-train at a random
# moment, N times (default 20). Every run must end with the clear error (exit 1, a
# "dion-train: error:" line, no abort or C++ backtrace), leave no tmp.* folder and a newest
# step_* folder that verifies (`dion-train export` reads it), and, once the space is back,
# resume to the uninterrupted run's losses bit for bit (metrics.jsonl, CPU).
#
# The full disk, at a random moment after the first checkpoint (within half the uninterrupted
# run's length): odd runs (when this user
# may mount a tmpfs: root) a filler file in the tmpfs checkpoint_dir of 3.5 checkpoints that
# leaves a random 0-90% of a checkpoint free (the free-space check refuses the next save, or a
# save under way fails with ENOSPC); even runs (and every run without mount rights) `prlimit
# --fsize` lowered on the running process to a random 1-9 MB (the next file write fails with
# EFBIG half-way). CI runs one iteration (ctest
# soak_train_diskfull.once); TrainCheckpoint.DiskFullLeavesThePreviousCheckpointAndAClearError
# is the deterministic test of the same.
#
#   scripts/soak_train_diskfull.sh [BUILD_DIR] [N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
N=${2:-20}
EXE=$BUILD/dion-train
source "$ROOT/scripts/tiny_shards.sh"
tiny_shards "$BUILD" dion_soak_train_diskfull
MNT=$WORK/mnt
mkdir -p "$MNT"
MOUNTED=0
cleanup() { [ "$MOUNTED" = 1 ] && umount "$MNT" 2> /dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
ARGS=(--data_dir "$WORK/shards" --model_dim 64 --n_layer 2 --n_head 2 --sequence_length 32 --batch_size 4
      --device_batch_size 2 --val_tokens 256 --val_loss_every 5 --num_iterations 30 --warmup_ratio 0
      --dtype fp32 --optimizer dion2 --scalar_opt adamw --log_every 100 --checkpoint_freq 2)
# The losses of a metrics.jsonl, one "kind step loss" line each (the wall-clock fields dropped).
losses() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l); print(j["kind"], j["step"], repr(j.get("loss", j.get("val_loss"))))' "$1"; }

t_ref=$(date +%s%N)
"$EXE" "${ARGS[@]}" --checkpoint_dir "$WORK/ref_ck" --run_dir "$WORK/ref" > "$WORK/ref.log" 2>&1
# The disk fills at a random moment in the first half of a run's length after its first
# checkpoint (the uninterrupted run's own time: a faster build must not finish before it).
HALF_RUN_DS=$(( ($(date +%s%N) - t_ref) / 200000000 ))  # tenths of a second
((HALF_RUN_DS >= 2)) || HALF_RUN_DS=2
losses "$WORK/ref/metrics.jsonl" > "$WORK/ref.losses"
CKPT_BYTES=$(du -sb "$WORK/ref_ck"/step_* | awk '{print $1; exit}')
if mount -t tmpfs -o size=$((CKPT_BYTES * 7 / 2)) tmpfs "$MNT" 2> /dev/null; then
  MOUNTED=1; MODE="tmpfs of $((CKPT_BYTES * 7 / 2 / 1000000)) MB"
else
  MODE="prlimit --fsize (no mount rights)"
fi
echo "checkpoint $((CKPT_BYTES / 1000000)) MB; disk full by: $MODE"
# A run the disk did not stop (it finished first: the filler can land while a save's temp folder
# holds space that rotation then frees) is not counted and another is run, up to 3 N runs.
ok=0 counted=0 i=0 t_start=$(date +%s)
while ((counted < N && i < 3 * N)); do
  i=$((i + 1))
  CK=$MNT/ck$i RUN=$WORK/run$i LOG=$WORK/run$i.log verdict=""
  "$EXE" "${ARGS[@]}" --checkpoint_dir "$CK" --run_dir "$RUN" > "$LOG" 2>&1 &
  pid=$!
  until ls -d "$CK"/step_* > /dev/null 2>&1 || ! kill -0 $pid 2> /dev/null; do sleep 0.05; done
  delay_ds=$((RANDOM % HALF_RUN_DS))
  sleep "$((delay_ds / 10)).$((delay_ds % 10))"
  if [ "$MOUNTED" = 1 ] && ((i % 2)); then
    avail=$(df -B1 --output=avail "$MNT" | tail -1)
    leave=$((CKPT_BYTES * (RANDOM % 90) / 100))
    fallocate -l $((avail > leave ? avail - leave : 1)) "$MNT/filler" 2> /dev/null || true
  else
    prlimit --pid $pid --fsize=$(((RANDOM % 80 + 10) * 100000)) 2> /dev/null || true
  fi
  wait $pid && code=0 || code=$?
  rm -f "$MNT/filler"
  newest=$(ls -d "$CK"/step_* 2> /dev/null | tail -1 || true)
  counted=$((counted + 1))
  if [ "$code" = 0 ]; then
    verdict="run finished before the disk filled (not counted)"; counted=$((counted - 1))
  elif [ "$code" != 1 ]; then verdict="FAILED: exit $code"
  elif ! grep -q "^dion-train: error: .*checkpoint" "$LOG"; then verdict="FAILED: no clear error"
  elif grep -qE "terminate called|frame #|Exception raised from" "$LOG"; then verdict="FAILED: abort or backtrace"
  elif ls -d "$CK"/tmp.* > /dev/null 2>&1; then verdict="FAILED: a tmp.* folder was left"
  elif ! "$EXE" export --checkpoint "$newest" -o "$WORK/x.safetensors" > "$WORK/export$i.log" 2>&1; then
    verdict="FAILED: the newest checkpoint does not verify"; cat "$WORK/export$i.log"
  elif ! "$EXE" "${ARGS[@]}" --checkpoint_dir "$CK" --run_dir "$RUN" > "$WORK/resume$i.log" 2>&1; then
    verdict="FAILED: the resume failed"; tail -3 "$WORK/resume$i.log"
  elif ! cmp -s <(losses "$RUN/metrics.jsonl") "$WORK/ref.losses"; then
    verdict="FAILED: the resumed losses differ from the uninterrupted run's"
  else
    ok=$((ok + 1)); verdict="ok"
  fi
  echo "run $i: exit $code: $(grep -m1 '^dion-train: error:' "$LOG" | cut -c1-150 || true)"
  echo "       newest $(basename "${newest:-none}"); $verdict"
  [ "${verdict:0:6}" = FAILED ] && tail -5 "$LOG"
  rm -rf "$CK" "$RUN"
done
echo "$ok of $counted disk-full runs ($i runs, $((i - counted)) not counted) ended with the clear error, a good" \
     "previous checkpoint and an exact resume ($(( $(date +%s) - t_start )) s)"
[ "$ok" = "$N" ]
