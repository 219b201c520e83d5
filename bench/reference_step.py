#!/usr/bin/env python3
"""The reference side of dion-bench: one optimizer step, microsoft/dion vs dion_cpp, one process.

For each GPT parameter set and optimizer class (the parameter set and groups of
bench/compare_reference.py), builds: the reference eager (TORCH_COMPILE_DISABLE is not needed:
torch.compiler.disable wraps its step), the reference compiled (with --compiled; its first
steps pay the compilation, reported as first_ms), dion_cpp on the exact path and dion_cpp on
the fast path (dion_cpp._C.set_ortho_path). Every variant takes the same steps on the same
gradients; steps are timed interleaved (the order reversed every round) on the process CPU
clock (time.process_time) at one thread. Also per variant: bytes allocated by one steady step
(torch.profiler with profile_memory: every CPU allocation of the step, the reference's and
dion_cpp's alike, since both allocate through c10's CPU allocator), the first step's time, and
the largest relative difference of the matrices to the reference eager after all steps.

Writes one JSON object (table "reference_step") to --json (appended) and a short summary to
stdout. Exits 0 with a message when microsoft/dion or dion_cpp is not importable.

    PYTHONPATH=build/python:/tmp/dion_ref python3 bench/reference_step.py --json out.jsonl
"""
import argparse
import warnings
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_reference as cr  # noqa: E402  (make_values, build, ctor_kwargs, rel_diff)
import machine  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default="768x2,256x4", help="d x layers list")
    p.add_argument("--classes", default="Muon,NorMuon,Dion2,NorDion2,Dion")
    p.add_argument("--reps", type=int, default=3, help="timed steps per variant (median)")
    p.add_argument("--compiled", action="store_true", help="also the reference with torch.compile")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--json", default="", help="append the table to this file")
    p.add_argument("--profile", action="store_true",
                   help="also one profiled step of the reference eager and ours exact: CPU ms per ATen op, "
                        "and the GEMMs' share of each step")
    return p.parse_args()


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_addmm_activation",
            "aten::mkldnn_matmul", "mkldnn::_linear_pointwise")


def op_profile(torch, step):
    """One step under torch.profiler: {op name: self CPU ms}, most first. dion_cpp's own ATen calls
    go through the same dispatcher, so both sides are counted the same way."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = {e.key: e.self_cpu_time_total / 1e3 for e in prof.key_averages()}
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]))


def step_bytes(torch, opt):
    """CPU bytes allocated during one step: the sum of the profiler's allocation events (frees
    not subtracted), whichever side allocates."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    total, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == _EventType.Allocation and e.extra_fields.alloc_size > 0:
            total += e.extra_fields.alloc_size
    return total


def main():
    args = parse_args()
    import torch
    cr.torch = torch
    try:
        import dion
    except Exception as e:  # noqa: BLE001
        print(f"SKIP: microsoft/dion not importable ({e!r})")
        return 0
    try:
        import dion_cpp
        from dion_cpp import _C
    except Exception as e:  # noqa: BLE001
        print(f"SKIP: dion_cpp not importable ({e!r})")
        return 0
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")

    class A:  # the keyword source compare_reference.ctor_kwargs reads
        fraction = 0.25
        rank_fraction = 0.25

    rows = []
    load_before = open("/proc/loadavg").read().split()[:3]
    for size in args.sets.split(","):
        d, layers = (int(x) for x in size.split("x"))
        gen = torch.Generator().manual_seed(0)
        values, grads, kinds = cr.make_values(d, layers, args.vocab, gen)
        for name in args.classes.split(","):
            kw = cr.ctor_kwargs(name, A)
            variants = {}
            with torch.compiler.set_stance("force_eager"):
                variants["ref_eager"] = cr.build(dion, name, kw, values, grads, kinds, True)
            variants["ours_exact"] = cr.build(dion_cpp, name, kw, values, grads, kinds, False)
            _C.set_ortho_path("fast")
            try:
                variants["ours_fast"] = cr.build(dion_cpp, name, kw, values, grads, kinds, False)
            finally:
                _C.set_ortho_path("exact")
            if args.compiled:
                # A fresh compilation per class and set: dynamo's recompile limit would otherwise
                # stop a fullgraph function after a few parameter sets (FailOnRecompileLimitHit).
                torch._dynamo.reset()
                variants["ref_compiled"] = cr.build(dion, name, kw, values, grads, kinds, True)

            counts = {k: 0 for k in variants}

            def run(key, opt):
                # Legacy Dion's randomized QR draws from the global generator: the k-th step of
                # every variant sees the same seed (as bench/compare_reference.py does).
                counts[key] += 1
                torch.manual_seed(1000 + counts[key])
                if key == "ref_eager":
                    with torch.compiler.set_stance("force_eager"):
                        opt.step()
                else:
                    opt.step()

            row = {"set": size, "class": name}
            for key, (opt, _) in variants.items():  # first step: state creation, compilation
                t0, w0 = time.process_time(), time.perf_counter()
                run(key, opt)
                row[key] = {"first_ms": (time.process_time() - t0) * 1e3,
                            "first_wall_ms": (time.perf_counter() - w0) * 1e3}
            for key, (opt, _) in variants.items():
                run(key, opt)  # a steady step before counting
                counts[key] += 1
                torch.manual_seed(1000 + counts[key])
                if key == "ref_eager":
                    with torch.compiler.set_stance("force_eager"):
                        row[key]["alloc_bytes"] = step_bytes(torch, opt)
                else:
                    row[key]["alloc_bytes"] = step_bytes(torch, opt)
            keys = list(variants)
            times = {k: [] for k in keys}
            for r in range(args.reps):
                order = keys if r % 2 == 0 else keys[::-1]
                for key in order:
                    t0 = time.process_time()
                    run(key, variants[key][0])
                    times[key].append(time.process_time() - t0)
            ref_params = variants["ref_eager"][1]
            for key in keys:
                row[key]["ms"] = statistics.median(times[key]) * 1e3
                row[key]["reps_ms"] = [t * 1e3 for t in times[key]]
                row[key]["max_rel_diff_to_ref_eager"] = max(
                    cr.rel_diff(o, r) for o, r in zip(variants[key][1], ref_params))
            if args.profile:
                for key in ("ref_eager", "ours_exact"):
                    ops = op_profile(torch, lambda: run(key, variants[key][0]))
                    total = sum(ops.values())
                    gemm = sum(ms for op, ms in ops.items() if op in GEMM_OPS)
                    row[key]["profile"] = {"total_ms": total, "gemm_ms": gemm, "ops_ms": dict(list(ops.items())[:15])}
                    print(f"{size} {name} {key}: profiled {total:.1f} ms, GEMMs {gemm:.1f} ms ({gemm / total:.0%}); "
                          + ", ".join(f"{op} {ms:.1f}" for op, ms in list(ops.items())[:8]), flush=True)
            rows.append(row)
            print(f"{size} {name}: " + ", ".join(
                f"{k} {row[k]['ms']:.1f} ms ({row[k]['alloc_bytes'] / 2**20:.0f} MiB, "
                f"first {row[k]['first_ms']:.0f} ms, diff {row[k]['max_rel_diff_to_ref_eager']:.1e})"
                for k in keys), flush=True)
            del variants
    table = {"table": "reference_step", "reps": args.reps, "rows": rows,
             "machine": dict(machine.info(torch, " ".join(load_before)),
                             reference_commit=os.environ.get("DION_REF_COMMIT", ""))}
    machine.append_json(args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
