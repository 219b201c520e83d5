#!/usr/bin/env bash
# scripts/soak_multihost_restart.sh — the cut-link-then-restart case, N times (default 20).
#
#   scripts/soak_multihost_restart.sh [BUILD_DIR] [N]
#
# Each iteration is tests/multihost/test_multihost.py::test_restart_after_cut_resumes_equal: two
# network-namespace hosts x 2 ranks (DDP), --max_restarts 1, host 1's link cut after a checkpoint
# and restored once both launchers say they restart; it passes when the job finishes and the
# resumed losses equal an uninterrupted run's (test_parallel.cpp's tolerances). Prints one line per
# iteration and "resumed with equal losses: K of N"; exit 0 when K == N. Needs root (ip netns).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
N=${2:-20}
PY=${PYTHON:-python3}
ok=0
for i in $(seq 1 "$N"); do
  t0=$(date +%s)
  if out=$(DION_BUILD_DIR=$BUILD "$PY" -m pytest -q -rs -s -p no:cacheprovider \
             "$ROOT/tests/multihost/test_multihost.py::test_restart_after_cut_resumes_equal" 2>&1); then
    ok=$((ok + 1)); verdict=equal
  elif grep -q "SKIPPED" <<<"$out"; then
    echo "skipped: $(grep -o 'network namespaces unavailable[^)]*' <<<"$out" | head -1)"; exit 0
  else
    verdict=FAILED
  fi
  echo "run $i/$N: $verdict ($(( $(date +%s) - t0 )) s) $(grep -o 'restart: .*' <<<"$out" | head -1)"
  [ "$verdict" = FAILED ] && tail -40 <<<"$out"
done
echo "resumed with equal losses: $ok of $N"
[ "$ok" -eq "$N" ]
