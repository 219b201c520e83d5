#!/usr/bin/env bash
# dion-cpp main job: setup (idempotent), then train a byte-level GPT on Tiny Shakespeare with
# Dion2 on the CPU, plot its loss curves and sample text from it. Everything it reads is in the
# clone (data/tinyshakespeare, checked against data/SHA256SUMS).
#
#   scripts/run.sh                      # the whole job (minutes on 2 cores: README "The main job")
#   scripts/run.sh --num_iterations 50  # extra arguments go to dion-train (docs/train.md keys)
#
# Steps: 1. scripts/setup.sh  2. data/tinyshakespeare into byte shards in data/shakespeare_bytes
# (dion-data prepare --tokenizer byte; paragraphs are documents; a paragraph goes to val while val
# holds under 10% of the tokens so far: 278 of the 7,222, spread through the text; once)
# 3. dion-train --config configs/shakespeare_bytes_dion2.yaml (a fresh run in
# runs/shakespeare_bytes_dion2)  4. dion-train plot -> runs/shakespeare_bytes_dion2/curves.png
# 5. dion-train sample from the final checkpoint. The GPT-2 BPE setup of the reference is
# configs/shakespeare_dion2.yaml (docs/train.md "Tiny Shakespeare with GPT-2 BPE").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
log() { printf '[run] %s\n' "$*"; }

(cd data && sha256sum --check --quiet SHA256SUMS) || {
  echo "[run] data/ does not match data/SHA256SUMS: restore it with git checkout data/" >&2
  exit 1
}

if ! compgen -G "data/shakespeare_bytes/fineweb_train_*.bin" > /dev/null; then
  log "tokenizing Tiny Shakespeare into byte shards in data/shakespeare_bytes (paragraphs; val: 10% of the tokens, whole paragraphs spread through the text)"
  "$BUILD_DIR/dion-data" prepare data/tinyshakespeare/input.txt -o data/shakespeare_bytes \
    --tokenizer byte --delimiter '\n\n' --val-fraction 0.1 --overwrite --quiet
fi

CONFIG=configs/shakespeare_bytes_dion2.yaml
RUN=runs/shakespeare_bytes_dion2
rm -rf "$RUN"   # a fresh run each time (dion-train itself resumes from checkpoint_dir)
log "training: dion-train --config $CONFIG $*"
"$BUILD_DIR/dion-train" --config "$CONFIG" "$@"

log "plotting: dion-train plot $RUN -o $RUN/curves.png"
"$BUILD_DIR/dion-train" plot "$RUN" -o "$RUN/curves.png" ||
  log "plot failed (needs python3 with matplotlib: pip install -r requirements.txt)"

log "sampling: dion-train sample --checkpoint $RUN/checkpoints --prompt 'ROMEO:'"
"$BUILD_DIR/dion-train" sample --checkpoint "$RUN/checkpoints" --prompt "ROMEO:" --max_tokens 400 \
  --temperature 0.8 --top_k 50 --tokenizer byte
