#!/usr/bin/env python3
"""Where a program's oneDNN time goes: every primitive it executes, summed by kind and shape.

    python3 bench/onednn_time.py [--per N] [--top 25] [--out FILE] -- COMMAND [ARGS...]

Runs COMMAND with ONEDNN_VERBOSE=1 (oneDNN then prints one line per primitive executed, with its
wall time in ms; LibTorch's bf16 and fp32 GEMMs on the CPU are oneDNN matmuls), and prints the
sum and count of each (primitive, implementation, memory formats, shape), largest first, divided
by --per (e.g. the number of training steps, to read ms a step; the program's start-up and any
validation are included, so run enough steps to make them small, or subtract them). With --out
the table also goes to FILE, headed by the command and the machine. The command's own output is
dropped except its last lines on failure. Not a test: nothing asserts on time. Example (dion-train's
bf16 4 x 256 side of bench/train_speed.py, 8 steps):

    python3 bench/onednn_time.py --per 8 -- build/dion-train --data_dir DIR --model_dim 256 \\
        --n_layer 4 --n_head 4 --sequence_length 128 --batch_size 8 --device_batch_size 8 \\
        --val_tokens 1024 --dtype bf16 --num_iterations 8 --val_loss_every 0 --checkpoint_freq 0
"""
import argparse
import collections
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per", type=float, default=1.0, help="divide sums and counts by this (e.g. steps)")
    p.add_argument("--top", type=int, default=25, help="rows to print (default 25)")
    p.add_argument("--out", default="", help="also write the table to this file")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no command: give it after --, e.g. -- build/dion-train --dtype bf16 ...")
    if args.per <= 0:
        p.error("--per must be positive")
    return args


def aggregate(lines):
    """{(primitive, implementation, formats, shape): [calls, ms]} from oneDNN's verbose lines."""
    agg = collections.defaultdict(lambda: [0, 0.0])
    for line in lines:
        if not line.startswith("onednn_verbose") or ",exec," not in line:
            continue
        f = line.strip().split(",")
        # onednn_verbose,v1,primitive,exec,cpu,KIND,IMPL,PROP,FORMATS,ATTRS,AUX,SHAPE,MS
        try:
            ms = float(f[-1])
        except ValueError:
            continue
        formats = f[8].replace("::blocked", "").replace("::f0", "")
        key = (f[5], f[6], formats, f[-2])
        agg[key][0] += 1
        agg[key][1] += ms
    return agg


def main(argv=None):
    args = parse_args(argv)
    load = machine.loadavg()
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    r = subprocess.run(args.command, env=env, capture_output=True, text=True)
    lines = (r.stdout + r.stderr).splitlines()
    if r.returncode != 0:
        sys.stderr.write("\n".join(lines[-20:]) + "\n")
        sys.exit(f"onednn_time: the command exited {r.returncode} (its last lines above)")
    agg = aggregate(lines)
    if not agg:
        sys.exit("onednn_time: no oneDNN primitive ran (or this LibTorch's oneDNN prints no verbose lines)")
    total = sum(v[1] for v in agg.values())
    import torch  # for the machine line only
    m = machine.info(torch, load)
    out = [f"# {' '.join(args.command)}",
           f"# {m['cpu']} ({' '.join(m['cpu_flags'])}); load average {m['loadavg']}; torch {m['torch_version']}; "
           f"{m['time_utc']}",
           f"oneDNN primitives: {total / args.per:.1f} ms in all, per {args.per:g}",
           f"{'ms':>9}  {'calls':>7}  primitive, implementation, formats, shape"]
    for (kind, impl, formats, shape), (n, ms) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:args.top]:
        out.append(f"{ms / args.per:9.2f}  {n / args.per:7.1f}  {kind} {impl} {formats} {shape}")
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
