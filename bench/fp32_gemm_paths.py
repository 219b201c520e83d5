#!/usr/bin/env python3
"""fp32 GEMMs through MKL (F.linear, at::mm) and through oneDNN (mkldnn::_linear_pointwise, what
dion-train's `model_kernels: fast` calls) at the shapes of the GPT of bench/train_speed.py (batch
8 x 128 tokens, vocabulary 50304; --width C, default 128): the lm_head's 256-row chunk (forward,
dh, dW) and the blocks' linears. One thread, medians of 9.

    python3 bench/fp32_gemm_paths.py [--width 128] [--layers 2]

Prints the CPU, the load average and, per shape, both times, GFLOP/s and oneDNN's time over MKL's;
then the GEMM time of one forward + backward of the --layers x --width model on the faster
library per shape (the lm_head's 4 chunks x 3 products, each block's q, k, v, proj, fc and mlp
proj x 3: forward, dx, dW; attention's own products left out): the floor no fused elementwise
code can go below. The script runs under dion-train's allocator settings (it re-executes itself
with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295, glibc's names for the mallopt calls
dion-train makes), so that a product's output reuses freed memory instead of faulting in 51 MB of
fresh pages each time. Not a test: nothing asserts on time.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch


def median_seconds(fn, n=9):
    fn()
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    if os.environ.get("MALLOC_MMAP_MAX_") != "0":  # dion-train's allocator settings (tools/dion-train/main.cpp)
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="4294967295")
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=128, help="the model width C")
    p.add_argument("--layers", type=int, default=2, help="blocks, for the forward + backward total")
    args = p.parse_args()
    torch.set_num_threads(1)
    onednn = torch.ops.mkldnn._linear_pointwise
    R, C, V, N = 256, args.width, 50304, 1024
    cases = [
        # (name, x, w, times in one forward + backward: lm_head 4 chunks; per block 3 per linear)
        (f"lm_head chunk forward [{R},{C}]x[{C},{V}]", torch.randn(R, C), torch.randn(V, C), 4),
        (f"lm_head chunk dh [{R},{V}]x[{V},{C}]", torch.randn(R, V), torch.randn(C, V), 4),
        (f"lm_head chunk dW [{V},{R}]x[{R},{C}]", torch.randn(V, R), torch.randn(C, R), 4),
        # the same dW as the chunked loss passes it: G'^T and h^T as views of [R, V] and [R, C]
        # (oneDNN's _linear_pointwise copies a transposed left operand, MKL reads it in place);
        # printed, not counted in the total
        ("lm_head chunk dW, transposed views", torch.randn(R, V).t(), torch.randn(R, C).t(), 0),
        # dW^T = h^T G' as the chunked loss computes it where the plan runs oneDNN: G' [R, V] read
        # in place as the weight (a transposed view), h^T a contiguous [C, R]; printed, not counted
        (f"lm_head chunk dW^T [{C},{R}]x[{R},{V}], G' in place", torch.randn(C, R), torch.randn(R, V).t(), 0),
        (f"q, k, v, proj [{N},{C}]x[{C},{C}]", torch.randn(N, C), torch.randn(C, C), 4 * 3 * args.layers),
        (f"mlp up [{N},{C}]x[{C},{4 * C}]", torch.randn(N, C), torch.randn(4 * C, C), 3 * args.layers),
        (f"mlp down [{N},{4 * C}]x[{4 * C},{C}]", torch.randn(N, 4 * C), torch.randn(C, 4 * C), 3 * args.layers),
    ]
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True)
    with open("/proc/loadavg") as f:
        print(f"{cpu.stdout.strip()}; load {f.read().split()[:3]}; torch {torch.__version__}; 1 thread")
    for _, x, w, _ in cases:  # the heap grows to its steady size before any timing
        torch.nn.functional.linear(x, w)
        onednn(x, w, None, "none", [], "")
    floor = 0.0
    for name, x, w, times in cases:
        flops = 2 * x.shape[0] * x.shape[1] * w.shape[0]
        a = median_seconds(lambda: torch.nn.functional.linear(x, w))
        b = median_seconds(lambda: onednn(x, w, None, "none", [], ""))
        floor += times * min(a, b)
        print(f"{name:56s} MKL {a * 1e3:7.2f} ms {flops / a / 1e9:6.1f} GF/s | "
              f"oneDNN {b * 1e3:7.2f} ms {flops / b / 1e9:6.1f} GF/s | oneDNN/MKL {b / a:.2f}")
    print(f"one forward + backward of {args.layers} x {C}: {floor * 1e3:.0f} ms of GEMMs (the faster library per shape)")


if __name__ == "__main__":
    main()
