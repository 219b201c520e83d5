#!/usr/bin/env bash
# tests/optim/registry_proof.sh — the toy algorithm of tests/optim/sign_descent.cpp, loaded as a
# plugin (DION_ALGORITHM_PLUGINS), runs through the trainer's config and `dion-bench step` with
# no other file knowing it: dion-train lists it in --help, trains 6 steps with
# `optimizer: sign_descent` (the loss falls), and dion-bench times its step.
#
#   tests/optim/registry_proof.sh BUILD_DIR PLUGIN
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$1
export DION_ALGORITHM_PLUGINS=$2
source "$ROOT/scripts/tiny_shards.sh"
tiny_shards "$BUILD" dion_registry_proof

"$BUILD/dion-train" --help > "$WORK/help.txt"
grep -q "sign_descent" "$WORK/help.txt" || { echo "FAIL: dion-train --help does not list sign_descent"; exit 1; }
cat > "$WORK/sign.yaml" <<YAML
optimizer: sign_descent
scalar_opt: adamw
lr: 0.002
mu: 0.9
YAML
"$BUILD/dion-train" --config "$WORK/sign.yaml" --data_dir "$WORK/shards" --run_dir "$WORK/run" --model_dim 64 \
  --n_layer 2 --n_head 2 --sequence_length 64 --batch_size 4 --device_batch_size 4 --val_tokens 256 \
  --val_loss_every 0 --num_iterations 6 --warmup_ratio 0 --dtype fp32 --log_every 1 > "$WORK/train.log" 2>&1 ||
  { cat "$WORK/train.log"; echo "FAIL: dion-train with optimizer sign_descent"; exit 1; }
python3 - "$WORK/run/metrics.jsonl" <<'PY'
import json, math, sys
losses = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "train"]
assert len(losses) >= 6 and all(math.isfinite(x) for x in losses), losses
assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
print(f"dion-train sign_descent: train_loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")
PY
"$BUILD/dion-bench" step --algos sign_descent --sets 64x1 --paths exact --reps 1 --vocab 256 > "$WORK/bench.log" 2>&1 ||
  { cat "$WORK/bench.log"; echo "FAIL: dion-bench step --algos sign_descent"; exit 1; }
grep -q "sign_descent" "$WORK/bench.log" || { cat "$WORK/bench.log"; echo "FAIL: no sign_descent row"; exit 1; }
grep "sign_descent" "$WORK/bench.log"
# An unknown name still fails with the registry's list, and the plugin's is in it.
if "$BUILD/dion-bench" step --algos sgd --sets 64x1 > "$WORK/bad.log" 2>&1; then echo "FAIL: --algos sgd accepted"; exit 1; fi
grep -q "sign_descent" "$WORK/bad.log" || { cat "$WORK/bad.log"; echo "FAIL: the error does not list sign_descent"; exit 1; }
# dion-bench dist takes any registered matrix algorithm, ALGORITHM@F for those with a size_option
# (tools/dion-bench/algorithms.h): the plugin's, a builtin's alias, legacy Dion with the optimizer's own
# gradient sync over 2 ranks.
"$BUILD/dion-bench" dist --ranks 1,2 --sets 64x1 --layouts ddp --reps 1 \
  --variants sign_descent,dion3@1/2,dion@0.5 > "$WORK/dist.log" 2>&1 ||
  { cat "$WORK/dist.log"; echo "FAIL: dion-bench dist --variants sign_descent,dion3@1/2,dion@0.5"; exit 1; }
for v in sign_descent dion3@1/2 dion@0.5; do
  grep -q -- "$v" "$WORK/dist.log" || { cat "$WORK/dist.log"; echo "FAIL: no dist row of $v"; exit 1; }
done
bad_variant() {  # VARIANT EXPECTED-TEXT
  if "$BUILD/dion-bench" dist --ranks 1 --sets 64x1 --reps 1 --variants "$1" > "$WORK/bad.log" 2>&1; then
    echo "FAIL: --variants $1 accepted"; exit 1; fi
  grep -qF -- "$2" "$WORK/bad.log" || { cat "$WORK/bad.log"; echo "FAIL: --variants $1: no '$2'"; exit 1; }
}
bad_variant muon@0.5 "muon orthogonalizes whole matrices and takes no '@' value"
bad_variant dion2 "dion2 needs '@' and its fraction"
bad_variant adamw "valid values are a matrix algorithm (muon, normuon, dion2, nordion2, dion, sign_descent)"
bad_variant dion2@2 "the value after '@' must be a number in (0, 1]"
echo "registry proof: ok"
