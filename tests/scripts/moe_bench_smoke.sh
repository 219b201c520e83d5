#!/bin/sh
# tests/scripts/moe_bench_smoke.sh PYTHON SOURCE_DIR BUILD_DIR OUT — the MoE benchmarks' plumbing,
# not their numbers: bench/moe_convergence.py --smoke (MoE and dense runs of each optimizer, the
# report's rows, the MoE runs' keys, the banner's active count below the total) and
# bench/moe_speed.py --smoke in fp32 and bf16 (four sides, the routing share on the MoE sides only).
set -eu
PY=$1 SRC=$2 BUILD=$3 OUT=$4
fail() { echo "moe_bench_smoke: FAIL: $*" >&2; exit 1; }
rm -rf "$OUT"
"$PY" "$SRC/bench/moe_convergence.py" --smoke --build "$BUILD" --out "$OUT/conv" --jobs 2 > "$OUT.conv" 2>&1 ||
  { cat "$OUT.conv" >&2; fail "moe_convergence.py --smoke exited non-zero"; }
R=$OUT/conv/moe_report.md
for want in "| adamw | 0.002 | 2 |" "| muon | 0.01 | 2 |" "| dion2-0.5 | 0.01 | 2 |" "MoE - dense, paired" "active (8 experts"; do
  grep -qF -- "$want" "$R" || { cat "$R" >&2; fail "'$want' not in $R"; }
done
grep -qF "## Failed runs" "$R" && { cat "$R" >&2; fail "a smoke run failed"; }
for d in "$OUT"/conv/runs/w32/moe_*; do
  grep -q "^n_experts: 8" "$d/config.yaml" || fail "$d is not an MoE run"
done
grep -q "^router_opt: \"*matrix" "$OUT"/conv/runs/w32/moe_muon_lr0.01_s0/config.yaml || fail "Muon's routers not on the matrix optimizer"
# --cpu_bind none: a machine with one core could not bind two ranks (dion_launch_tests check the binding)
for dtype in fp32 bf16; do
  "$PY" "$SRC/bench/moe_speed.py" --smoke --dtype $dtype --cpu_bind none --build "$BUILD" --out "$OUT/speed" \
    > "$OUT.speed" 2>&1 || { cat "$OUT.speed" >&2; fail "moe_speed.py --smoke --dtype $dtype exited non-zero"; }
  for want in "| dense, 1 rank |" "| MoE, 1 rank |" "| dense, dp 2 |" "| MoE, dp 2 x ep 2 |" "- $dtype; "; do
    grep -qF -- "$want" "$OUT.speed" || { cat "$OUT.speed" >&2; fail "'$want' not in moe_speed.py's table"; }
  done
  grep "| dense," "$OUT.speed" | grep -q "| — |$" || fail "a dense side has a routing share"
  grep "| MoE," "$OUT.speed" | grep -q "%" || fail "the MoE sides have no routing share"
done
grep -q "^dtype: \"*bf16" "$OUT"/speed/MoE_dp2xep2_bf16_r0/config.yaml || fail "the bf16 side's run did not compute in bf16"
echo "moe_bench_smoke: ok"
