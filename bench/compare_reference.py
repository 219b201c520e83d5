#!/usr/bin/env python3
"""Time one optimizer step of dion_cpp against microsoft/dion, side by side in one process (CPU).

For each model size and optimizer class, two optimizers are built with the same keywords and
the same param groups (reference group keys) over two identical copies of a GPT-like parameter
set: per layer q, k, v, o [d, d], mlp up [4d, d] and down [d, 4d] in the matrix group, the
embedding [vocab, d] and the norms [d] in an "adamw" group, and lm_head [vocab, d] in a
"lion" group. Both get the same fixed random gradients (set once, reused every step). After
--warmup steps each, --repeats single steps are timed per implementation, alternating which
one goes first, and the median ms/step is reported. Finally the parameters of the two copies
are compared (max over params of max|ours - ref| / max|ref|). Prints a markdown table.

Nothing here asserts on time: it is a measurement, not a test.

    PYTHONPATH=build/python:/path/to/microsoft/dion TORCH_COMPILE_DISABLE=1 \
        python3 bench/compare_reference.py --threads 1

Without TORCH_COMPILE_DISABLE=1 the reference runs its torch.compile'd kernels (inductor on
CPU needs a C++ compiler); the warm-up steps absorb the compilation.
Exits 0 with a message when the reference package (`import dion`) is not importable.
"""
import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

CLASSES = ["Muon", "NorMuon", "Dion2", "NorDion2", "Dion"]


def parse_args():
    p = argparse.ArgumentParser(
        description="Time dion_cpp vs microsoft/dion optimizer steps in one process (CPU).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", default="512x4,768x4",
                   help="comma-separated model_dim x layers list, e.g. 512x4,768x12")
    p.add_argument("--vocab", type=int, default=8192, help="embedding / lm_head rows")
    p.add_argument("--classes", default=",".join(CLASSES),
                   help="comma-separated optimizer classes (Muon, NorMuon, Dion2, NorDion2, "
                        "Dion3, Dion)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per implementation")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed single steps per implementation (median reported)")
    p.add_argument("--fraction", type=float, default=0.25, help="Dion2 / NorDion2 fraction")
    p.add_argument("--rank-fraction", type=float, default=0.25, help="Dion rank_fraction")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        info = {}
        for line in out.splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
        return (f"{info.get('Model name', platform.processor())}, "
                f"{info.get('CPU(s)', os.cpu_count())} CPUs, "
                f"{info.get('Thread(s) per core', '?')} thread(s)/core")
    except OSError:
        return f"{platform.processor()}, {os.cpu_count()} CPUs"


def make_values(d, layers, vocab, gen):
    """(values, grads, kinds): kinds[i] is 'matrix', 'adamw' or 'lion'."""
    shapes = []
    for _ in range(layers):
        shapes += [((d, d), "matrix")] * 4                      # q, k, v, o
        shapes += [((4 * d, d), "matrix"), ((d, 4 * d), "matrix")]  # mlp up, down
        shapes += [((d,), "adamw")] * 2                          # attn / mlp norms
    shapes += [((vocab, d), "adamw"), ((d,), "adamw"), ((vocab, d), "lion")]  # emb, final norm, head
    values, grads, kinds = [], [], []
    for shape, kind in shapes:
        scale = 1.0 if len(shape) == 1 else shape[-1] ** -0.5
        values.append(torch.randn(shape, generator=gen) * scale)
        grads.append(torch.randn(shape, generator=gen) * 1e-2)
        kinds.append(kind)
    return values, grads, kinds


def ctor_kwargs(name, args):
    kw = {"lr": 0.02, "weight_decay": 0.01}
    if name in ("Dion2", "NorDion2", "Dion3"):
        kw["fraction"] = args.fraction
    if name == "Dion":
        kw["rank_fraction"] = args.rank_fraction
    return kw


def build(module, name, kw, values, grads, kinds, is_ref):
    params = [torch.nn.Parameter(v.clone()) for v in values]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    groups = [{"params": [p for p, k in zip(params, kinds) if k == "matrix"]},
              {"params": [p for p, k in zip(params, kinds) if k == "adamw"],
               "algorithm": "adamw", "lr": 0.003},
              {"params": [p for p, k in zip(params, kinds) if k == "lion"],
               "algorithm": "lion", "lr": 0.0003}]
    torch.manual_seed(1234)
    opt = getattr(module, name)(groups, **kw)
    if name == "Dion":
        # Legacy Dion draws Q from the global generator at state creation: create it now, in
        # the same order on both sides, so that the two copies stay comparable.
        torch.manual_seed(4321)
        if is_ref:
            for group in opt.param_groups:
                for p in group["params"]:
                    opt._get_or_initialize_state(p, group)
        else:
            opt.init_state()
    return opt, params


def timed_step(opt, seed):
    torch.manual_seed(seed)  # Dion's randomized QR draws sketches from the global generator
    t0 = time.perf_counter()
    opt.step()
    return time.perf_counter() - t0


def rel_diff(actual, expected):
    a, e = actual.detach().double(), expected.detach().double()
    scale = e.abs().max().item()
    d = (a - e).abs().max().item()
    return d / scale if scale > 0 else d


def run_case(dion, dion_cpp, name, args, values, grads, kinds):
    kw = ctor_kwargs(name, args)
    ref, ref_params = build(dion, name, kw, values, grads, kinds, True)
    ours, our_params = build(dion_cpp, name, kw, values, grads, kinds, False)
    times = {"ref": [], "ours": []}
    seed = 100
    for i in range(args.warmup + args.repeats):
        seed += 1
        order = [("ref", ref), ("ours", ours)]
        if i % 2:
            order.reverse()
        for key, opt in order:
            t = timed_step(opt, seed)
            if i >= args.warmup:
                times[key].append(t)
    diff = max(rel_diff(o, r) for o, r in zip(our_params, ref_params))
    del ref, ours, ref_params, our_params
    return (statistics.median(times["ref"]) * 1e3, statistics.median(times["ours"]) * 1e3, diff,
            times)


def main():
    args = parse_args()
    global torch
    import torch  # noqa: E402
    try:
        import dion  # the reference package (microsoft/dion)
    except Exception as e:  # noqa: BLE001
        print(f"SKIP: reference package microsoft/dion not importable ({e!r}); "
              "set PYTHONPATH to a checkout of it to run this comparison.")
        return 0
    try:
        import dion_cpp
    except Exception as e:  # noqa: BLE001
        print(f"SKIP: dion_cpp not importable ({e!r}); build it and add build/python to "
              "PYTHONPATH.")
        return 0

    torch.set_num_threads(args.threads)
    compile_disabled = os.environ.get("TORCH_COMPILE_DISABLE", "") not in ("", "0")
    load_before = loadavg()
    cmd = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    env = " ".join(f"{k}={os.environ[k]}" for k in ("PYTHONPATH", "TORCH_COMPILE_DISABLE")
                   if k in os.environ)
    print(f"# dion_cpp vs microsoft/dion, one optimizer step (CPU, fp32)")
    print()
    print(f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"- command: `{env} {cmd}`")
    print(f"- cpu: {cpu_model()}")
    print(f"- torch {torch.__version__}, python {platform.python_version()}, "
          f"threads {torch.get_num_threads()}, reference torch.compile "
          f"{'disabled' if compile_disabled else 'enabled'}")
    print(f"- warmup {args.warmup}, timed steps {args.repeats} per implementation (median, "
          f"alternating order), vocab {args.vocab}, Dion2/NorDion2 fraction {args.fraction}, "
          f"Dion rank_fraction {args.rank_fraction}")
    print(f"- load average before: {load_before}")
    print()
    print("| model | class | reference ms/step | dion_cpp ms/step | speedup | max rel diff |")
    print("|---|---|---:|---:|---:|---:|")
    sys.stdout.flush()
    raw = []
    for size in args.sizes.split(","):
        d, layers = (int(x) for x in size.lower().split("x"))
        gen = torch.Generator().manual_seed(args.seed)
        values, grads, kinds = make_values(d, layers, args.vocab, gen)
        nparam = sum(v.numel() for v in values) / 1e6
        for name in args.classes.split(","):
            name = name.strip()
            r_ms, o_ms, diff, times = run_case(dion, dion_cpp, name, args, values, grads, kinds)
            raw.append((size, name, times))
            print(f"| d={d}, L={layers} ({nparam:.1f}M) | {name} | {r_ms:.1f} | {o_ms:.1f} | "
                  f"{r_ms / o_ms:.2f}x | {diff:.1e} |")
            sys.stdout.flush()
        del values, grads
    print()
    print(f"- load average after: {loadavg()}")
    print("- raw step times (ms), reference / dion_cpp:")
    for size, name, times in raw:
        fmt = lambda ts: ", ".join(f"{t * 1e3:.1f}" for t in ts)  # noqa: E731
        print(f"  - {size} {name}: [{fmt(times['ref'])}] / [{fmt(times['ours'])}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
