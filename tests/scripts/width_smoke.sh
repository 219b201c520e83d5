#!/bin/sh
# tests/scripts/width_smoke.sh PYTHON SOURCE_DIR BUILD_DIR OUT — runs bench/width_study.py --smoke
# (two tiny widths, AdamW, Muon and Dion2 0.25, a few steps) into OUT and checks its plumbing, not
# its numbers: the report's sections and a row per width and optimizer, the PNG, the lr grid of the
# second width centred on the first width's best, the seeds moving the data order, the matrix
# optimizers' embedding and lm_head at AdamW's tuned lr, the shorter schedules and the "why" runs,
# a second invocation that trains nothing again, and --report on a study with runs missing.
set -eu
PY=$1 SRC=$2 BUILD=$3 OUT=$4
fail() { echo "width_smoke: FAIL: $*" >&2; exit 1; }
rm -rf "$OUT"
"$PY" "$SRC/bench/width_study.py" --smoke --build "$BUILD" --out "$OUT" --jobs 2 > "$OUT.stdout" 2> "$OUT.stderr" ||
  { cat "$OUT.stderr" >&2; fail "width_study.py --smoke exited $?"; }
R=$OUT/report.md
[ -f "$R" ] || fail "no $R"
for want in "Machine:" "## Per width" "| 32 |" "| 64 |" "| muon |" "| dion2-0.25 |" "gap to Muon, paired" \
            "Expectation (Dion2 0.25's gap to Muon shrinks as width grows)" \
            "## Steps and seconds to AdamW's final val loss (width 32, shorter schedules)" "64 ranks" \
            "## Why: Dion2 0.25's gap to Muon at width 32" "mu 0.8" "twice the steps" "gap_vs_width.png"; do
  grep -qF -- "$want" "$R" || { cat "$R" >&2; fail "'$want' not in $R"; }
done
grep -qF "## Failed runs" "$R" && { cat "$R" >&2; fail "a smoke run failed"; }
head -c 8 "$OUT/gap_vs_width.png" | od -An -c | grep -q "P   N   G" || fail "gap_vs_width.png is not a PNG"
"$PY" - "$OUT" <<'PYEOF' || fail "the runs are not what the study says"
import json, os, sys
out = sys.argv[1]
recs = json.load(open(os.path.join(out, "runs.json")))["runs"]
def cfg(r):
    keys = {}
    for line in open(os.path.join(r["run_dir"], "config.yaml")):
        k, _, v = line.partition(":")
        keys[k.strip()] = v.strip().strip('"')
    return keys
def tuned(w, n):
    sweep = [r for r in recs if r["width"] == w and r["name"] == n and r["phase"] == "sweep"]
    return min(sweep, key=lambda r: r["final"])["lr"]
for r in recs:
    c = cfg(r)
    assert c["seed"] == c["data_seed"] == str(r["seed"]), (r["run_dir"], c["seed"], c["data_seed"])
    if r["name"] != "adamw":  # the scalars at AdamW's tuned lr of the same width
        assert float(c["embed_lr"]) == float(c["lm_head_lr"]) == tuned(r["width"], "adamw"), r["run_dir"]
# The second width's grid (factor 1) is the first width's best.
for n in ("adamw", "muon", "dion2-0.25"):
    assert {r["lr"] for r in recs if r["width"] == 64 and r["name"] == n} == {tuned(32, n)}, n
variants = {r["variant"] for r in recs if r["width"] == 32 and r["name"] == "dion2-0.25"}
assert {"", "_n2", "_n8", "_mu0.8"} <= variants, variants
assert any(r["variant"] == "_n8" for r in recs if r["name"] == "muon"), "Muon at twice the steps"
PYEOF
before=$(cat "$OUT"/runs/*/*/train.log | cksum)
"$PY" "$SRC/bench/width_study.py" --smoke --build "$BUILD" --out "$OUT" > /dev/null 2>&1 || fail "second run failed"
after=$(cat "$OUT"/runs/*/*/train.log | cksum)
[ "$before" = "$after" ] || fail "the second run trained again"
# --report on a study with runs missing: the report of what finished, and nothing trained.
rm -rf "$OUT"/runs/w64
"$PY" "$SRC/bench/width_study.py" --smoke --report --build "$BUILD" --out "$OUT" > /dev/null 2>&1 || fail "--report failed"
[ ! -d "$OUT/runs/w64" ] || fail "--report trained the missing runs"
grep -qF "| 32 | " "$R" && ! grep -qF "| 64 | " "$R" || { cat "$R" >&2; fail "--report: not the finished runs"; }
echo "width_smoke: ok ($(ls -d "$OUT"/runs/*/*/ | wc -l) runs, $R)"
