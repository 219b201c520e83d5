#!/usr/bin/env python3
"""Why docs/benchmarks.md once said ~200 GFLOP/s for bf16: the same product through four calls.

    python3 bench/matmul_paths.py [--size 2048]

Times X X^T for X [1, s, s] bf16 on one thread (process CPU time) through at::matmul with the
transposed view (what bench_ortho's baseline and the exact path call), at::bmm on the same
operands, at::matmul with a contiguous transpose, a 2-D at::mm, at::bmm in fp16 and fp32; then
at::matmul on two
threads by the wall clock (the old page's method) . Prints GFLOP/s per call and the load average.
"""
import argparse
import time

import torch


def rate(fn, flops, clock=time.process_time, seconds=0.5):
    fn()
    t0, n = clock(), 0
    while clock() - t0 < seconds:
        fn()
        n += 1
    return flops * n / (clock() - t0) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=2048)
    s = p.parse_args().size
    torch.set_num_threads(1)
    X = torch.randn(1, s, s, dtype=torch.bfloat16)
    Xt = X.mT.contiguous()
    flops = 2 * s ** 3
    print(f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}; X [1, {s}, {s}] bf16")
    for name, fn in [("at::matmul(X, X.mT)", lambda: X @ X.mT),
                     ("at::bmm(X, X.mT)", lambda: torch.bmm(X, X.mT)),
                     ("at::matmul(X, contiguous X^T)", lambda: X @ Xt),
                     ("at::mm(X[0], X[0].T)", lambda: X[0] @ X[0].T)]:
        print(f"  1 thread, CPU time   {name:32s} {rate(fn, flops):6.0f} GFLOP/s")
    for dtype in (torch.float16, torch.float32):
        Y = X.to(dtype)
        print(f"  1 thread, CPU time   {'at::bmm, ' + str(dtype):32s} "
              f"{rate(lambda: torch.bmm(Y, Y.mT), flops):6.0f} GFLOP/s")
    torch.set_num_threads(2)
    print(f"  2 threads, wall time {'at::matmul(X, X.mT)':32s} "
          f"{rate(lambda: X @ X.mT, flops, time.perf_counter):6.0f} GFLOP/s")


if __name__ == "__main__":
    main()
