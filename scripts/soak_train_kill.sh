#!/usr/bin/env bash
# scripts/soak_train_kill.sh — kill -9 a random rank of a parallel dion-train at a random moment
# while it checkpoints every step, N times (default 20). After each kill the newest checkpoint
# must verify and resume to the end, and the resumed run's losses (metrics.jsonl: the records
# up to the checkpoint from the killed run, the rest from the resumed one) must equal the
# uninterrupted run's: bit for bit when it resumes at the same layout (odd kills: 2-rank FSDP),
# within the layouts' tolerance (relative 3e-4, tests/train/parallel/test_parallel.cpp) when it resumes
# at 1 process (even kills: resharding is exercised too).
# CI runs one iteration (ctest soak_train_kill.once) and one kill in
# tests/train/parallel/test_parallel.cpp (KillDashNineDuringSaves...).
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
      --device_batch_size 1 --val_tokens 256 --val_loss_every 0 --num_iterations 16 --warmup_ratio 0
      --dtype fp32 --optimizer muon --scalar_opt adamw --log_every 100 --comm_timeout_s 20)
# Starts the 2 ranks of a 2-rank FSDP run with extra arguments "$@"; their pids in $pids.
start_fsdp2() {
  local port=$((20000 + RANDOM % 20000)) r
  pids=()
  for r in 0 1; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      "$EXE" "${ARGS[@]}" --fs_size 2 "$@" > "$LOG.rank$r" 2>&1 &
    pids+=($!)
  done
}
# Compares two metrics.jsonl: every record's loss equal (tolerance 0) or within a relative tolerance.
compare() { python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def load(p):
    out = {}
    for line in open(p):
        j = json.loads(line)
        out[(j["kind"], j["step"])] = j.get("loss", j.get("val_loss"))
    return out
ref, got, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if ref.keys() != got.keys(): sys.exit(f"records differ: {sorted(set(ref) ^ set(got))[:4]}")
worst = max(abs(got[k] - ref[k]) / abs(ref[k]) for k in ref)
if worst > tol: sys.exit(f"max relative difference {worst:.3g} > {tol}")
print(f"{len(ref)} records, max relative difference {worst:.3g}")
PY
}

LOG=$WORK/ref.log
start_fsdp2 --run_dir "$WORK/ref" --checkpoint_dir "$WORK/ref_ck" --checkpoint_freq 1
wait "${pids[0]}" && wait "${pids[1]}" || { echo "the reference run failed"; cat "$LOG.rank0"; exit 1; }
ok=0 t_start=$(date +%s)
for ((i = 1; i <= N; i++)); do
  CK=$WORK/ck$i RUN=$WORK/run$i LOG=$WORK/run$i.log
  start_fsdp2 --checkpoint_dir "$CK" --checkpoint_freq 1 --run_dir "$RUN"
  until ls -d "$CK"/step_* > /dev/null 2>&1; do sleep 0.05; done  # the first checkpoint exists
  sleep "0.$((RANDOM % 10))$((RANDOM % 10))"
  victim=$((RANDOM % 2))
  kill -9 "${pids[$victim]}" 2> /dev/null || true
  other=$((1 - victim)); t0=$(date +%s)
  wait "${pids[$other]}" && code=0 || code=$?
  wait "${pids[$victim]}" 2> /dev/null || true
  latest=$(ls -d "$CK"/step_* | tail -1)
  if ((i % 2)); then
    where="2-rank FSDP, exact" tol=0 LOG=$WORK/resume$i.log
    start_fsdp2 --checkpoint_dir "$CK" --run_dir "$RUN"
    wait "${pids[0]}" && wait "${pids[1]}" && resumed=0 || resumed=$?
    rlog=$LOG.rank0
  else
    where="1 process, tolerance 3e-4" tol=3e-4 rlog=$WORK/resume$i.log
    "$EXE" "${ARGS[@]}" --checkpoint_dir "$CK" --run_dir "$RUN" > "$rlog" 2>&1 && resumed=0 || resumed=$?
  fi
  if [ "$resumed" != 0 ] || ! grep -q "resumed from" "$rlog"; then
    verdict="RESUME FAILED"; tail -5 "$rlog"
  elif ! cmp_out=$(compare "$WORK/ref/metrics.jsonl" "$RUN/metrics.jsonl" $tol 2>&1); then
    verdict="LOSSES DIFFER: $cmp_out"
  else
    ok=$((ok + 1)); verdict="resumed at $where: $cmp_out"
  fi
  echo "kill $i: rank $victim killed; rank $other exited $code after $(( $(date +%s) - t0 )) s; newest $(basename "$latest"): $verdict"
  rm -rf "$CK"
done
echo "$ok of $N kills left a checkpoint that resumed to the uninterrupted run's losses ($(( $(date +%s) - t_start )) s)"
[ "$ok" = "$N" ]
