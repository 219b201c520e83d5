#!/usr/bin/env bash
# scripts/fsdp_memory.sh — FSDP peak memory per rank (a benchmark, not a test): dion-train's
# run-summary peak RSS at 1 process and at fs 2 / fs 4 with reshard_after_forward true and false,
# on the tiny GPT of the tests (2 x 64) and a larger one (8 x 512), debug mode (synthetic tokens,
# 20 steps, T 64, batch 2 x fs of device batch 1), Muon + AdamW, fp32. Prints the markdown table of
# docs/benchmarks.md ("FSDP peak memory").
#
#   scripts/fsdp_memory.sh [BUILD_DIR]      # default: build
#   MODELS="64x2" scripts/fsdp_memory.sh    # only the tiny model (default: "64x2 512x8")
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
EXE=${1:-$ROOT/build}/dion-train
WORK=$(mktemp -d /tmp/dion_fsdp_memory.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
ARGS=(--debug true --n_head 4 --sequence_length 64 --dtype fp32 --optimizer muon --log_every 5 --val_loss_every 0)
echo "| model | layout | reshard_after_forward | peak RSS per rank (MB) | model KB/step/rank | prefetched (forward; backward) |"
echo "|---|---|---|---|---|---|"
for model in ${MODELS:-64x2 512x8}; do
  dim=${model%x*} layers=${model#*x}
  for run in "1 true" "2 true" "2 false" "4 true" "4 false"; do
    read -r fs rs <<< "$run"
    launch=(); [ "$fs" -gt 1 ] && launch=(--nproc "$fs" --fs_size "$fs")
    log=$WORK/$dim.$layers.$fs.$rs.log
    "$EXE" "${launch[@]}" "${ARGS[@]}" --model_dim "$dim" --n_layer "$layers" --reshard_after_forward "$rs" \
      --run_dir "$WORK/run.$dim.$layers.$fs.$rs" > "$log" 2>&1 || { cat "$log"; exit 1; }
    python3 - "$log" "$dim x $layers" "$fs" "$rs" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
m = re.search(r"peak RSS per rank \(MB\): ([0-9, ]+); sent per step by rank 0: model (\d+) KB", log)
f = re.search(r"FSDP: (\d+) of (\d+) forward weight gathers prefetched, (\d+) of (\d+) backward", log)
layout = "1 process" if sys.argv[3] == "1" else f"fs {sys.argv[3]}"
pre = f"{f.group(1)}/{f.group(2)}; {f.group(3)}/{f.group(4)}" if f else "-"
rs = sys.argv[4] if sys.argv[3] != "1" else "-"
print(f"| {sys.argv[2]} | {layout} | {rs} | {m.group(1)} | {m.group(2)} | {pre} |")
PY
  done
done
