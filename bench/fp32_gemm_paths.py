#!/usr/bin/env python3
"""fp32 GEMMs through MKL (F.linear, at::mm) and through oneDNN (mkldnn::_linear_pointwise, what
dion-train's `model_kernels: fast` calls) at the shapes of the 2 x 128 GPT of bench/train_speed.py:
the lm_head's 256-row chunk (forward, dh, dW) and the blocks' linears. One thread, medians of 9.

    python3 bench/fp32_gemm_paths.py

Prints the CPU, the load average and, per shape, both times, GFLOP/s and oneDNN's time over MKL's.
Not a test: nothing asserts on time.
"""
import argparse
import statistics
import subprocess
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
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)
    onednn = torch.ops.mkldnn._linear_pointwise
    R, C, V, N = 256, 128, 50304, 1024
    cases = [
        ("lm_head chunk forward [256,128]x[128,50304]", torch.randn(R, C), torch.randn(V, C)),
        ("lm_head chunk dh [256,50304]x[50304,128]", torch.randn(R, V), torch.randn(C, V)),
        ("lm_head chunk dW [50304,256]x[256,128]", torch.randn(V, R), torch.randn(C, R)),
        ("qkv [1024,128]x[128,384]", torch.randn(N, C), torch.randn(3 * C, C)),
        ("mlp up [1024,128]x[128,512]", torch.randn(N, C), torch.randn(4 * C, C)),
        ("mlp down [1024,512]x[512,128]", torch.randn(N, 4 * C), torch.randn(C, 4 * C)),
    ]
    cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True)
    with open("/proc/loadavg") as f:
        print(f"{cpu.stdout.strip()}; load {f.read().split()[:3]}; torch {torch.__version__}; 1 thread")
    for name, x, w in cases:
        flops = 2 * x.shape[0] * x.shape[1] * w.shape[0]
        a = median_seconds(lambda: torch.nn.functional.linear(x, w))
        b = median_seconds(lambda: onednn(x, w, None, "none", [], ""))
        print(f"{name:45s} MKL {a * 1e3:7.2f} ms {flops / a / 1e9:6.1f} GF/s | "
              f"oneDNN {b * 1e3:7.2f} ms {flops / b / 1e9:6.1f} GF/s | oneDNN/MKL {b / a:.2f}")


if __name__ == "__main__":
    main()
