#!/bin/sh
# tests/scripts/best_smoke.sh PYTHON SOURCE_DIR BUILD_DIR OUT — runs bench/best_vs_best.py --smoke
# (tiny widths, a few steps) into OUT and checks its plumbing, not its numbers: the timing, the
# report's sections, the mu grid with one more mu beyond a best at its edge, the lr runs around
# the best mu, the winners' seeds, the equal-time runs at the timed step count, the control's
# rows, the seeds moving the data order, the same scalar lr for every run, and a second
# invocation that trains nothing again.
set -eu
PY=$1 SRC=$2 BUILD=$3 OUT=$4
fail() { echo "best_smoke: FAIL: $*" >&2; exit 1; }
rm -rf "$OUT"
"$PY" "$SRC/bench/best_vs_best.py" --smoke --build "$BUILD" --out "$OUT" --jobs 2 > "$OUT.stdout" 2> "$OUT.stderr" ||
  { cat "$OUT.stderr" >&2; fail "best_vs_best.py --smoke exited $?"; }
R=$OUT/report.md
[ -f "$R" ] || fail "no $R"
for want in "Machine:" "Timing (alone" "equal-time budget" "## Tuning at width 64 (seed 0)" "**winner**" \
            "## Width 64: equal steps and equal time" "| Muon |" "| Dion2 0.25, equal steps |" \
            "| Dion2 0.25, equal time |" "## Control at width 32" "| dion2-1 |" "best_vs_best.png"; do
  grep -qF -- "$want" "$R" || { cat "$R" >&2; fail "'$want' not in $R"; }
done
grep -qF "## Failed runs" "$R" && { cat "$R" >&2; fail "a smoke run failed"; }
grep -qF "Not finished yet" "$R" && { cat "$R" >&2; fail "runs left unfinished"; }
head -c 8 "$OUT/best_vs_best.png" | od -An -c | grep -q "P   N   G" || fail "best_vs_best.png is not a PNG"
"$PY" - "$OUT" <<'PYEOF' || fail "the runs are not what the study says"
import json, os, sys
out = sys.argv[1]
j = json.load(open(os.path.join(out, "runs.json")))
recs, p = j["runs"], j["params"]
def cfg(r):
    keys = {}
    for line in open(os.path.join(r["run_dir"], "config.yaml")):
        k, _, v = line.partition(":")
        keys[k.strip()] = v.strip().strip('"')
    return keys
for r in recs:
    c = cfg(r)
    assert c["seed"] == c["data_seed"] == str(r["seed"]), r["run"]
    assert float(c["embed_lr"]) == float(c["lm_head_lr"]) == p["scalar_lr"], r["run"]
    assert float(c["mu"]) == r["mu"], r["run"]
w = p["width"]
for name, mus in p["mus"].items():
    tried = sorted({r["mu"] for r in recs if r["width"] == w and r["name"] == name and r["phase"] == "mu"})
    best = min((r for r in recs if r["width"] == w and r["name"] == name and r["phase"] == "mu"), key=lambda r: r["final"])
    assert set(mus) <= set(tried), (name, tried)
    if best["mu"] in (min(tried), max(tried)):
        assert len(tried) == len(mus) + 1 and best["mu"] not in mus, ("a best at the grid's edge without a run beyond", name, tried)
    lrs = {r["lr"] for r in recs if r["width"] == w and r["name"] == name and r["phase"] == "lr"}
    assert {p["base_lr"] * f for f in p["lr_factors"]} <= lrs, (name, lrs)
seeds = {(r["name"], r["seed"]) for r in recs if r["phase"] == "seeds"}
assert seeds == {(n, s) for n in p["mus"] for s in range(1, p["seeds"])}, seeds
times = [r for r in recs if r["phase"] == "time"]
assert len(times) == p["seeds"] and all(r["steps"] == j["equal_time_steps"] for r in times), times
ctl = {(r["name"], r["mu"], r["seed"]) for r in recs if r["width"] == p["control_width"]}
for n in p["control_optimizers"]:
    for mu in p["control_mus"]:
        for s in range(p["seeds"]):
            assert (n, mu, s) in ctl, (n, mu, s)
PYEOF
before=$(cat "$OUT"/runs/*/*/train.log | cksum)
"$PY" "$SRC/bench/best_vs_best.py" --smoke --build "$BUILD" --out "$OUT" > /dev/null 2>&1 || fail "second run failed"
after=$(cat "$OUT"/runs/*/*/train.log | cksum)
[ "$before" = "$after" ] || fail "the second run trained again"
echo "best_smoke: ok ($(ls -d "$OUT"/runs/*/*/ | wc -l) runs, $R)"
