#!/usr/bin/env bash
# bench/run_ortho.sh — build bench_ortho, run it, print the markdown for docs/benchmarks.md.
#
#   bench/run_ortho.sh [bench_ortho flags...]          # default grid: a few minutes on 2 cores
#   bench/run_ortho.sh --sizes=2048,4096 --batches=1   # the large rows
#
# stdout: machine, command, load, one table (time per call, GFLOP/s, ratio to the matmul
# baseline of the same size) and a summary; stderr: the build and Google Benchmark's console.
# Environment: DION_BENCH_BUILD_DIR (default build-bench/, ignored by git), DION_BENCH_JOBS
# (ninja jobs, default 1), DION_BENCH_JSON (raw results, default <build dir>/bench_ortho.json),
# PYTHON (default python3: finds LibTorch and formats the table).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${DION_BENCH_BUILD_DIR:-$ROOT/build-bench}
JOBS=${DION_BENCH_JOBS:-1}
PYTHON=${PYTHON:-python3}
JSON=${DION_BENCH_JSON:-$BUILD_DIR/bench_ortho.json}

# ---------------------------------------------------------------------------- build
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDION_SKIP_DATA=ON -DDION_BUILD_TESTS=OFF -DDION_BUILD_BENCH=ON \
    -DCMAKE_PREFIX_PATH="$($PYTHON -c 'import torch; print(torch.utils.cmake_prefix_path)')" >&2
fi
ninja -C "$BUILD_DIR" -j "$JOBS" bench_ortho >&2
BIN="$BUILD_DIR/bench/bench_ortho"
if [ ! -x "$BIN" ]; then
  echo "run_ortho.sh: $BIN was not built (is libbenchmark-dev installed?)" >&2
  exit 1
fi

# ---------------------------------------------------------------------------- run
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
"$BIN" "$@" --benchmark_out="$JSON" --benchmark_out_format=json >&2
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------- report
cpu_field() { lscpu | sed -n "s/^$1: *//p" | head -1; }
BENCH_CPU="$(cpu_field 'Model name')"
export BENCH_CPU="$BENCH_CPU (family $(cpu_field 'CPU family'), model $(cpu_field Model))"
export BENCH_CORES="$(nproc) ($(cpu_field 'Thread(s) per core') thread(s) per core)"
export BENCH_BF16="$(grep -q avx512_bf16 /proc/cpuinfo && echo yes || echo no)"
export BENCH_COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
export BENCH_COMMAND="bench/run_ortho.sh${*:+ $*}"
export BENCH_STARTED="$started" BENCH_LOAD_BEFORE="$load_before" BENCH_LOAD_AFTER="$load_after"
"$PYTHON" - "$JSON" <<'EOF'
import json, os, statistics, sys

doc = json.load(open(sys.argv[1]))
ctx = doc["context"]
env = os.environ
cpu_clock = ctx.get("bench_clock") == "cpu"
time_field = "cpu_time" if cpu_clock else "real_time"

# One row per benchmark name: the median aggregate when repeated, else the mean of its runs.
rows, runs = {}, {}
for b in doc["benchmarks"]:
    name = b["run_name"] if "run_name" in b else b["name"]
    name = name.removesuffix("/real_time")
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
    entry = {"ms": b[time_field] * scale, "gflops": b.get("GFLOP/s"), "x": b.get("x_matmul")}
    if b.get("run_type") == "aggregate":
        if b.get("aggregate_name") == "median":
            rows[name] = entry
    else:
        runs.setdefault(name, []).append(entry)
for name, entries in runs.items():
    if name not in rows:
        mean = lambda k: (statistics.mean(e[k] for e in entries)
                          if all(e[k] is not None for e in entries) else None)
        rows[name] = {k: mean(k) for k in ("ms", "gflops", "x")}

configs = []  # (dtype, "m x n", batch) in the binary's order
for name in rows:
    method, dtype, shape, batch = name.split("/")
    key = (dtype, shape, batch)
    if key not in configs:
        configs.append(key)

def cell(v, fmt):
    return "—" if v is None else fmt.format(v)

def ms(v):
    return "—" if v is None else (f"{v:.3g}" if v < 100 else f"{v:.0f}")

methods = [("newton_schulz", "NS"), ("polar_express", "PE")]
print(f"- date: {env['BENCH_STARTED']}; commit {env['BENCH_COMMIT']}")
print(f"- CPU: {env['BENCH_CPU']}, {env['BENCH_CORES']}, AVX-512 BF16 {env['BENCH_BF16']}")
print(f"- LibTorch {ctx.get('torch_version', '?')}, {ctx.get('torch_threads', '?')} intra-op "
      f"thread(s), MKL {ctx.get('torch_mkl', '?')}, oneDNN {ctx.get('torch_mkldnn', '?')}")
print(f"- load average (1, 5, 15 min): {env['BENCH_LOAD_BEFORE']} before, "
      f"{env['BENCH_LOAD_AFTER']} after")
print(f"- clock: " + ("process CPU time (`--clock=cpu`, 1 thread): time taken by other "
                     "processes on the shared cores is not counted" if cpu_clock
                     else "wall clock"))
print(f"- command: `{env['BENCH_COMMAND']}`")
busy = max(float(env[k].split()[0]) for k in ("BENCH_LOAD_BEFORE", "BENCH_LOAD_AFTER"))
if busy > 0.5 * (os.cpu_count() or 1):
    print(f"- warning: 1-minute load reached {busy:.2f} on {os.cpu_count()} CPUs: other work "
          f"shared the cores, " + ("so caches and memory bandwidth were shared too" if cpu_clock
          else "so wall times are inflated (multi-threaded ones badly: try --threads=1 "
                "--clock=cpu)"))
print()
head = "| dtype | m x n | batch | matmul ms | matmul GFLOP/s |"
rule = "|---|---|--:|--:|--:|"
for _, short in methods:
    head += f" {short} ms | {short} GFLOP/s | {short} / matmul |"
    rule += "--:|--:|--:|"
print(head)
print(rule)
for dtype, shape, batch in configs:
    mm = rows.get(f"matmul/{dtype}/{shape}/{batch}", {})
    line = (f"| {dtype} | {shape.replace('x', ' x ')} | {batch[1:]} | {ms(mm.get('ms'))} "
            f"| {cell(mm.get('gflops'), '{:.1f}')} |")
    for method, _ in methods:
        r = rows.get(f"{method}/{dtype}/{shape}/{batch}", {})
        if r and mm:  # the ratio of the two times shown (the binary's x_matmul when alone)
            r["x"] = r["ms"] / mm["ms"]
        line += (f" {ms(r.get('ms'))} | {cell(r.get('gflops'), '{:.1f}')} "
                 f"| {cell(r.get('x'), '{:.1f}')} |")
    print(line)

print()
def span(values):
    return (f"{min(values):.2f}–{max(values):.2f} (median {statistics.median(values):.2f}, "
            f"{len(values)} configs)") if values else "—"
for method, short in methods:
    for dtype in ("fp32", "bf16"):
        xs = [r["x"] for n, r in rows.items() if n.startswith(f"{method}/{dtype}/") and r["x"]]
        if xs:
            print(f"- {short} {dtype} time / matmul time: {span(xs)}")
for method, short in [("matmul", "matmul")] + methods:
    ratios = []
    for dtype, shape, batch in configs:
        if dtype != "bf16":
            continue
        a = rows.get(f"{method}/bf16/{shape}/{batch}")
        b = rows.get(f"{method}/fp32/{shape}/{batch}")
        if a and b:
            ratios.append(a["ms"] / b["ms"])
    if ratios:
        print(f"- {short} bf16 time / fp32 time: {span(ratios)}")
EOF
