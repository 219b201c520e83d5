#!/usr/bin/env bash
# Soak test of two-rank exits: N runs of a 2-process torch.distributed (Gloo, 127.0.0.1) script
# that steps an optimizer 3 times and exits with it alive, counting each rank's exit status
# (0, 134 = SIGABRT, other). Modes:
#   dion       a dion_cpp Muon over the default group, alive at exit (a module global)
#   dioncycle  the same, kept in a reference cycle with an LR scheduler and gc disabled
#   torch      torch.optim.SGD with all_reduced gradients (torch alone: the baseline)
# DESTROY=1 calls dist.destroy_process_group() before the exit.
#
# Usage: scripts/soak_python_exit.sh [N=50] [MODE=dion]
#   DION_BUILD_DIR   build directory with python/dion_cpp (default: ./build)
# Exit status: 0 when every rank of every run exited with 0. Logs of failed runs are kept in a
# new directory in /tmp (printed).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-50}
MODE=${2:-dion}
BUILD_DIR=${DION_BUILD_DIR:-$(pwd)/build}
case "$MODE" in dion|dioncycle|torch) ;; *) echo "usage: $0 [N] [dion|dioncycle|torch]" >&2; exit 2 ;; esac
DIR=$(mktemp -d /tmp/dion_soak_exit.XXXXXX)
cat >"$DIR/rank.py" <<'PY'
import datetime, os, sys
import torch, torch.distributed as dist
rank, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
torch.manual_seed(0)
ps = [torch.nn.Parameter(torch.randn(16, 8)) for _ in range(3)]
sched = None
if mode == "torch":
    opt = torch.optim.SGD(ps, lr=0.02)
else:
    import dion_cpp
    opt = dion_cpp.Muon(ps, distributed_mesh=dist.group.WORLD, lr=0.02)
    if mode == "dioncycle":
        import gc
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        opt.cycle = opt
        gc.disable()
for s in range(3):
    for p in ps:
        p.grad = torch.ones_like(p)
        if mode == "torch":
            dist.all_reduce(p.grad)
    opt.step()
    if sched is not None:
        sched.step()
if os.environ.get("DESTROY") == "1":
    dist.destroy_process_group()
PY
ok=0; aborted=0; other=0
for i in $(seq 1 "$N"); do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in 0 1; do
    PYTHONPATH="$BUILD_DIR/python" TORCH_COMPILE_DISABLE=1 timeout 120 \
      python3 "$DIR/rank.py" "$r" "$port" "$MODE" >"$DIR/run$i.rank$r.log" 2>&1 &
    pids[$r]=$!
  done
  for r in 0 1; do
    wait "${pids[$r]}"; rc=$?
    if [ "$rc" -eq 0 ]; then ok=$((ok + 1)); rm -f "$DIR/run$i.rank$r.log"
    elif [ "$rc" -eq 134 ]; then aborted=$((aborted + 1)); echo "run $i rank $r: SIGABRT (log: $DIR/run$i.rank$r.log)"
    else other=$((other + 1)); echo "run $i rank $r: exit $rc (log: $DIR/run$i.rank$r.log)"; fi
  done
done
echo "soak_python_exit ($MODE${DESTROY:+, DESTROY=$DESTROY}): $N runs, $((2 * N)) rank exits: $ok clean, $aborted SIGABRT, $other other"
[ "$aborted" -eq 0 ] && [ "$other" -eq 0 ]
