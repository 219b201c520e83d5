#!/bin/sh
# tests/scripts/convergence_smoke.sh PYTHON SOURCE_DIR BUILD_DIR OUT — runs bench/convergence.py
# --smoke (byte shards of Tiny Shakespeare, AdamW and Dion2 at one lr, a few steps of a tiny
# model, two seeds) into OUT and checks its plumbing, not its numbers: the report has the
# parameter split, the sweep and the tuned table with a row per optimizer, the fast vs exact table
# (Dion2 0.25 again with ortho_path fast), the three PNGs are PNGs, every run finished with the
# ortho_path it was given, --results copies the report files, and a second run reuses the finished
# runs (none trained again).
set -eu
PY=$1 SRC=$2 BUILD=$3 OUT=$4
fail() { echo "convergence_smoke: FAIL: $*" >&2; exit 1; }
rm -rf "$OUT"
"$PY" "$SRC/bench/convergence.py" --smoke --build "$BUILD" --out "$OUT" --jobs 2 --results "$OUT/published" \
  > "$OUT.stdout" 2> "$OUT.stderr" ||
  { cat "$OUT.stderr" >&2; fail "convergence.py --smoke exited $?"; }
R=$OUT/report.md
[ -f "$R" ] || fail "no $R"
for want in "Parameters:" "hidden matrices" "## Sweep" "## Tuned" "| adamw |" "| dion2-0.25 |" \
            "tuned lr" "steps to AdamW's final" "optimizer share of step" "8 ranks FSDP" "val_loss_vs_step.png" \
            "val_loss_vs_time.png" "Machine:" "## Fast vs exact orthogonalizer" "| dion2-0.25 | 0.02 | 2 |" \
            "agree within the seed spread" "val_loss_fast_vs_exact.png"; do
  grep -qF -- "$want" "$R" || { cat "$R" >&2; fail "'$want' not in $R"; }
done
grep -qF "## Failed runs" "$R" && { cat "$R" >&2; fail "a smoke run failed"; }
# --results: the report, runs.json and the PNGs copied for committing (bench/results/STUDY).
for f in report.md runs.json val_loss_vs_step.png val_loss_fast_vs_exact.png; do
  cmp -s "$OUT/$f" "$OUT/published/$f" || fail "--results: $f not copied to $OUT/published"
done
for png in val_loss_vs_step.png val_loss_vs_time.png val_loss_fast_vs_exact.png; do
  [ -s "$OUT/$png" ] || fail "no $OUT/$png"
  head -c 8 "$OUT/$png" | od -An -c | grep -q "P   N   G" || fail "$OUT/$png is not a PNG"
done
# 2 optimizers x 1 lr (seed 0) + 1 more seed each + Dion2 0.25 fast x 2 seeds = 6 runs, each with
# its metrics, and the path each was given in its config.yaml.
n=$(ls -d "$OUT"/runs/*/ | wc -l)
[ "$n" -eq 6 ] || fail "$n run folders in $OUT/runs, expected 6"
for d in "$OUT"/runs/*_fast/; do grep -q "^ortho_path: .fast." "$d/config.yaml" || fail "$d/config.yaml: not ortho_path fast"; done
for d in "$OUT"/runs/*_s[01]/; do grep -q "^ortho_path: .exact." "$d/config.yaml" || fail "$d/config.yaml: not ortho_path exact"; done
[ "$(ls -d "$OUT"/runs/*_fast/ | wc -l)" -eq 2 ] || fail "expected 2 fast runs"
for d in "$OUT"/runs/*/; do
  grep -q '"kind":"val"' "$d/metrics.jsonl" || grep -q '"kind": "val"' "$d/metrics.jsonl" ||
    fail "$d/metrics.jsonl has no val line"
done
# The byte shards record their tokenizer: slot [3] of the header is 1.
"$PY" - "$OUT/data/fineweb_val_000000.bin" <<'PYEOF' || fail "the benchmark's val shard is not a byte shard"
import struct, sys
h = struct.unpack("<4i", open(sys.argv[1], "rb").read(16))
sys.exit(0 if h[0] == 20240520 and h[3] == 1 else 1)
PYEOF
# A second run reuses every finished run (no "dion-train" started: the logs are unchanged).
before=$(cat "$OUT"/runs/*/train.log | cksum)
"$PY" "$SRC/bench/convergence.py" --smoke --build "$BUILD" --out "$OUT" > /dev/null 2>&1 || fail "second run failed"
after=$(cat "$OUT"/runs/*/train.log | cksum)
[ "$before" = "$after" ] || fail "the second run trained again"
echo "convergence_smoke: ok ($n runs, $R)"
