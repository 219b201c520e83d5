#!/usr/bin/env python3
"""Causal attention in bf16 on one CPU thread: ATen's bf16 flash attention against its fp32 one
over the same bf16 operands (what dion-train's fast kind runs at T <= kAttentionUpcastMaxT,
dion/train/kernels.h causal_attention), forward + backward, with each side's error against fp64.

    python3 bench/attention_speed.py [--shapes B,H,T,D;...] [--reps 9] [--json FILE]

For each shape: q, k, v and the output's gradient are bf16 [B, H, T, D]; side "bf16" is
F.scaled_dot_product_attention(q, k, v, is_causal=True) and backward (the exact kind, and the
reference, under autocast); side "fp32 on bf16" is the same call on q, k, v made fp32, its output
rounded to bf16 (the casts' backward rounds the gradients to bf16 too). The two sides alternate
call by call in one process, so they share the machine's load; a side's figure is the median of
--reps. The error columns: the largest |gradient - fp64's| over dq, dk, dv (all rounded to bf16 at
the end; the fp64 evaluation runs on the same bf16 values). Run it with dion-train's allocator
settings (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4294967295; the script sets them and starts
itself again) so that the figures are the trainer's. Prints a markdown table and appends one JSON
object to --json. Not a test: nothing asserts on time.
"""
import argparse
import os
import statistics
import sys
import time

if os.environ.get("MALLOC_MMAP_MAX_") != "0":  # dion-train's allocator settings (tools/dion-train/main.cpp)
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="4294967295"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

DEFAULT_SHAPES = "8,4,128,32;8,4,128,64;16,4,256,32;8,4,384,32;8,4,384,64;8,4,512,64;4,4,1024,32;2,8,1024,64"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=DEFAULT_SHAPES, help="B,H,T,D;B,H,T,D;... (default: %(default)s)")
    p.add_argument("--reps", type=int, default=9, help="timed calls per side and shape (default 9)")
    p.add_argument("--json", default="", help="append the table as one JSON line to this file")
    args = p.parse_args(argv)
    try:
        args.shape_list = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";") if s]
        assert all(len(s) == 4 and min(s) > 0 for s in args.shape_list)
    except (ValueError, AssertionError):
        p.error(f"--shapes: '{args.shapes}': expected B,H,T,D;B,H,T,D;... of positive integers")
    if args.reps < 1:
        p.error("--reps must be at least 1")
    return args


def bf16_side(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def upcast_side(q, k, v):
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).bfloat16()


def grads(side, q0, k0, v0, g):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q0, k0, v0))
    y = side(q, k, v)
    y.backward(g.to(y.dtype))
    return [q.grad, k.grad, v.grad]


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    load = machine.loadavg()
    rows = []
    for (B, H, T, D) in args.shape_list:
        torch.manual_seed(0)
        q, k, v, g = (torch.randn(B, H, T, D).bfloat16() for _ in range(4))
        exact = grads(lambda a, b, c: F.scaled_dot_product_attention(a.double(), b.double(), c.double(),
                                                                     is_causal=True), q, k, v, g)
        err = {name: max((a.double() - e).abs().max().item() for a, e in zip(grads(side, q, k, v, g), exact))
               for name, side in (("bf16", bf16_side), ("upcast", upcast_side))}
        times = {"bf16": [], "upcast": []}
        for name, side in (("bf16", bf16_side), ("upcast", upcast_side)):
            grads(side, q, k, v, g)  # warm-up: oneDNN's kernels, the allocator
        for _ in range(args.reps):
            for name, side in (("bf16", bf16_side), ("upcast", upcast_side)):
                t0 = time.perf_counter()
                grads(side, q, k, v, g)
                times[name].append(time.perf_counter() - t0)
        med = {n: statistics.median(ts) * 1e3 for n, ts in times.items()}
        rows.append({"B": B, "H": H, "T": T, "D": D, "bf16_ms": med["bf16"], "upcast_ms": med["upcast"],
                     "speedup": med["bf16"] / med["upcast"], "bf16_max_err": err["bf16"],
                     "upcast_max_err": err["upcast"]})
        print(f"[attention_speed] B {B} H {H} T {T} D {D}: bf16 {med['bf16']:.2f} ms, fp32 on bf16 "
              f"{med['upcast']:.2f} ms", file=sys.stderr, flush=True)
    table = {"bench": "attention_speed", "machine": machine.info(torch, load), "reps": args.reps, "rows": rows}
    m = table["machine"]
    print(f"- machine: {m['cpu']} ({' '.join(m['cpu_flags'])}); load average {m['loadavg']}; "
          f"torch {m['torch_version']}; {m['time_utc']}")
    print("- one thread; forward + backward of causal attention, median of "
          f"{args.reps} calls a side, the sides alternating\n")
    print("| B | H | T | D | bf16 flash ms | fp32 flash on bf16 ms | speedup | max grad error: bf16 | fp32 on bf16 |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['B']} | {r['H']} | {r['T']} | {r['D']} | {r['bf16_ms']:.2f} | {r['upcast_ms']:.2f} | "
              f"{r['speedup']:.2f}x | {r['bf16_max_err']:.2g} | {r['upcast_max_err']:.2g} |")
    machine.append_json(args.json, table)


if __name__ == "__main__":
    main()
