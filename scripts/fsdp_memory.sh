#!/usr/bin/env bash
# scripts/fsdp_memory.sh — FSDP peak memory per rank (a benchmark, not a test): dion-train's
# run-summary peak RSS at 1 process and at fs 2 / fs 4 with reshard_after_forward true and false
# and with fast_fsdp, on the tiny GPT of the tests (2 x 64) and a larger one (8 x 512), debug mode
# (synthetic tokens, 20 steps, T 64, batch 2 x fs of device batch 1: 2 micro-batches per rank),
# Muon + AdamW, fp32. Prints the markdown table of docs/benchmarks.md ("FSDP peak memory").
#
#   scripts/fsdp_memory.sh [BUILD_DIR]      # default: build
#   MODELS="64x2" scripts/fsdp_memory.sh    # only the tiny model (default: "64x2 512x8")
#   RUNS="1 true,2 fast" scripts/fsdp_memory.sh   # some runs: "FS RESHARD" or "FS fast"
#   STEPS=1 MODELS=768x4 scripts/fsdp_memory.sh   # STEPS steps on Tiny Shakespeare instead of
#                                                 # debug mode's 20 (same batch; needs dion-data)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
EXE=$BUILD/dion-train
ARGS=(--n_head 4 --sequence_length 64 --dtype fp32 --optimizer muon --log_every 5 --val_loss_every 0)
if [ -n "${STEPS:-}" ]; then
  source "$ROOT/scripts/tiny_shards.sh"
  tiny_shards "$BUILD" dion_fsdp_memory   # sets WORK (removed on exit)
  ARGS+=(--data_dir "$WORK/shards" --num_iterations "$STEPS" --device_batch_size 1 --val_tokens 256)
else
  WORK=$(mktemp -d /tmp/dion_fsdp_memory.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
  ARGS+=(--debug true)
fi
IFS=, read -r -a RUN_LIST <<< "${RUNS:-1 true,2 true,2 false,2 fast,4 true,4 false,4 fast}"
echo "| model | layout | reshard_after_forward | peak RSS per rank (MB) | model KB/step/rank | prefetched (forward; backward) |"
echo "|---|---|---|---|---|---|"
for model in ${MODELS:-64x2 512x8}; do
  dim=${model%x*} layers=${model#*x}
  for run in "${RUN_LIST[@]}"; do
    read -r fs rs <<< "$run"
    case "$rs" in true | false) mode=(--reshard_after_forward "$rs") ;; fast) mode=(--fast_fsdp true) ;;
      *) echo "run '$run': 'FS true', 'FS false' or 'FS fast'" >&2; exit 2 ;; esac
    launch=(); [ "$fs" -gt 1 ] && launch=(--nproc "$fs" --fs_size "$fs")
    [ -n "${STEPS:-}" ] && launch+=(--batch_size $((2 * fs)))
    log=$WORK/$dim.$layers.$fs.$rs.log
    "$EXE" "${launch[@]}" "${ARGS[@]}" --model_dim "$dim" --n_layer "$layers" "${mode[@]}" \
      --run_dir "$WORK/run.$dim.$layers.$fs.$rs" > "$log" 2>&1 || { cat "$log"; exit 1; }
    python3 - "$log" "$dim x $layers" "$fs" "$rs" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
m = re.search(r"peak RSS per rank \(MB\): ([0-9, ]+); sent per step by rank 0: model (\d+) KB", log)
f = re.search(r"FSDP: (\d+) of (\d+) forward weight gathers prefetched, (\d+) of (\d+) backward", log)
layout = "1 process" if sys.argv[3] == "1" else f"fs {sys.argv[3]}"
pre = f"{f.group(1)}/{f.group(2)}; {f.group(3)}/{f.group(4)}" if f else "-"
rs = "-" if sys.argv[3] == "1" else "false, fast_fsdp" if sys.argv[4] == "fast" else sys.argv[4]
print(f"| {sys.argv[2]} | {layout} | {rs} | {m.group(1)} | {m.group(2)} | {pre} |")
PY
  done
done
