#!/usr/bin/env bash
# scripts/bench_parallel.sh — dion-train's parallel layouts measured (a benchmark, not a test):
# tokens/s, peak memory per rank, and bytes sent per step per rank for the model (forward /
# backward / gradient sync) and the optimizer step, at 1, 2 and 4 processes, DDP vs FSDP vs TP,
# for Muon and Dion2 (fraction 0.25). Prints the markdown table of docs/benchmarks.md.
#
#   scripts/bench_parallel.sh [BUILD_DIR] [STEPS]      # default: build, 6
#   OPTIMIZERS=muon LAYOUTS="1 2 1,1 2 1 fast" scripts/bench_parallel.sh   # a subset
#
# The model: 4 layers, 256 wide, 4 heads, T 128, 8 sequences a step (device batch 1: 8 / ranks
# accumulation steps per data-parallel rank), Tiny Shakespeare, fp32 on CPU, OMP_NUM_THREADS=1
# per rank. tokens/s is the mean over the steps after the first (rank 0's clock). A layout is
# "dp fs tp", "fast" after it adds --fast_fsdp true (FSDP: weights gathered and gradients
# reduce-scattered once per step).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
STEPS=${2:-6}
EXE=$BUILD/dion-train
source "$ROOT/scripts/tiny_shards.sh"
tiny_shards "$BUILD" dion_bench_parallel
ARGS=(--data_dir "$WORK/shards" --model_dim 256 --n_layer 4 --n_head 4 --sequence_length 128 --batch_size 8
      --device_batch_size 1 --val_tokens 512 --val_loss_every 0 --num_iterations "$STEPS" --warmup_ratio 0
      --dtype fp32 --scalar_opt adamw --ortho_fraction 0.25 --log_every 1 --comm_timeout_s 600)

echo "| optimizer | layout | processes | tokens/s | peak RSS per rank (MB) | model KB/step/rank | optimizer KB/step/rank |"
echo "|---|---|---|---|---|---|---|"
IFS=, read -r -a SPECS <<< "${LAYOUTS:-1 1 1,2 1 1,1 2 1,1 2 1 fast,1 1 2,4 1 1,1 4 1,1 4 1 fast,1 2 2}"
for opt in ${OPTIMIZERS:-muon dion2}; do
  for spec in "${SPECS[@]}"; do
    read -r dp fs tp fast <<< "$spec"
    case "$fast" in "") ff=false ;; fast) ff=true ;; *) echo "layout '$spec': 'dp fs tp' or 'dp fs tp fast'" >&2; exit 2 ;; esac
    n=$((dp * fs * tp)) port=$((20000 + RANDOM % 20000)) pids=() name="$opt.$dp.$fs.$tp${fast:+.fast}"
    for ((r = 0; r < n; r++)); do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
        "$EXE" "${ARGS[@]}" --optimizer "$opt" --dp_size "$dp" --fs_size "$fs" --tp_size "$tp" \
        --fast_fsdp "$ff" --run_dir "$WORK/$name" > "$WORK/$name.rank$r.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { cat "$WORK/$name".rank*.log; exit 1; }; done
    layout="dp $dp x fs $fs x tp $tp${fast:+, fast_fsdp}"
    python3 - "$WORK/$name/metrics.jsonl" "$WORK/$name.rank0.log" "$opt" "$layout" "$n" <<'PY'
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
tps = [r["tokens_per_s"] for r in recs[1:]] or [recs[0]["tokens_per_s"]]
log = open(sys.argv[2]).read()
m = re.search(r"peak RSS per rank \(MB\): ([0-9, ]+); sent per step by rank 0: model (\d+) KB, optimizer (\d+) KB", log)
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {sum(tps) / len(tps):.0f} | {m.group(1)} | {m.group(2)} | {m.group(3)} |")
PY
  done
done
