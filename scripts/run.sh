#!/usr/bin/env bash
# dion-cpp main job: setup (idempotent), then train a small GPT on Tiny Shakespeare with Dion2 on
# the CPU, plot its loss curves and sample text from it. Everything it reads is in the clone
# (data/: GPT-2 tokenizer files and Tiny Shakespeare, checked against data/SHA256SUMS).
#
#   scripts/run.sh                     # the whole job (a few minutes on 2 cores)
#   scripts/run.sh --num_iterations 50 # extra arguments go to dion-train (docs/train.md keys)
#
# Steps: 1. scripts/setup.sh  2. tokenize data/tinyshakespeare into data/shakespeare (dion-data
# prepare; once)  3. dion-train --config configs/shakespeare_dion2.yaml (a fresh run in
# runs/shakespeare_dion2)  4. dion-train plot -> runs/shakespeare_dion2/curves.png
# 5. dion-train sample from the final checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
log() { printf '[run] %s\n' "$*"; }

(cd data && sha256sum --check --quiet SHA256SUMS) || {
  echo "[run] data/ does not match data/SHA256SUMS: restore it with git checkout data/" >&2
  exit 1
}

if ! compgen -G "data/shakespeare/fineweb_train_*.bin" > /dev/null; then
  log "tokenizing Tiny Shakespeare into data/shakespeare (GPT-2 BPE; the first 32,768 tokens are the val shard)"
  "$BUILD_DIR/dion-data" prepare data/tinyshakespeare/input.txt -o data/shakespeare \
    --shard-size 32768 --tokenizer data/gpt2 --overwrite
fi

RUN=runs/shakespeare_dion2
rm -rf "$RUN"   # a fresh run each time (dion-train itself resumes from checkpoint_dir)
log "training: dion-train --config configs/shakespeare_dion2.yaml $*"
"$BUILD_DIR/dion-train" --config configs/shakespeare_dion2.yaml "$@"

log "plotting: dion-train plot $RUN -o $RUN/curves.png"
"$BUILD_DIR/dion-train" plot "$RUN" -o "$RUN/curves.png" ||
  log "plot failed (needs python3 with matplotlib: pip install -r requirements.txt)"

log "sampling: dion-train sample --checkpoint $RUN/checkpoints --prompt 'ROMEO:'"
"$BUILD_DIR/dion-train" sample --checkpoint "$RUN/checkpoints" --prompt "ROMEO:" --max_tokens 120 \
  --temperature 0.8 --top_k 50 --tokenizer data/gpt2
