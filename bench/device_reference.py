#!/usr/bin/env python3
"""The reference's rows of scripts/device_check.sh's table: microsoft/dion on the same shapes.

    python3 bench/device_reference.py --reference DIR [--device cuda|cpu] [--quick] [--reps N]
        [--peak-tflops X] [--autotune pruned|full] [--compile]

DIR is a checkout (or `git archive`) of microsoft/dion: its `dion` package is imported from
there; nothing of it is copied here. Prints markdown table rows (no header) on stdout, in the
format of bench/device_bench.cpp, for the 160M model's matrix set ([48, 768, 768],
[12, 768, 3072], [12, 3072, 768]; every dimension / 8 with --quick):
  - its orthogonalizers, 5 iterations in bf16, TFLOP/s counted with the same flops as
    device_bench (X X^T 2 r^2 c, A A 2 r^3, B X 2 r^2 c per iteration) and that rate / the
    matmul peak given by --peak-tflops (device_bench's first row; "-" without it):
    newton_schulz_triton and polar_express_triton (its Triton kernels that compute only the
    lower tiles of X X^T and A A and mirror them; CUDA with triton only), and the pure-torch
    zeropower_via_newtonschulz5 and polar_express;
  - its optimizer step per class (Muon, NorMuon, Dion2, NorDion2, Dion; lr 0.02, the rest its
    defaults, use_triton where the class has it and Triton runs), fp32 parameters with random
    gradients, after 2 warm-up steps.
torch.compile is disabled (TORCH_COMPILE_DISABLE=1, set before torch is imported) unless
--compile: the reference wraps its torch orthogonalizers, polar_express_triton and parts of its
step in torch.compile, whose first calls cost tens of seconds per shape, more than the device
check's budget; without it those run eagerly (the Triton kernels are Triton either way).
Triton autotunes each kernel per shape over 30-36 configurations on first use (minutes in all);
--autotune pruned (the default) keeps the few configurations listed in PRUNED_CONFIGS, full keeps
the reference's list. The row names say which.

What it is not: a test (no thresholds), or a correctness comparison (bench/compare_reference.py
and the reference-vector tests do that). Exits 0 with one row saying why when the reference is
not importable; a row that fails prints its error instead of a number.
"""
import argparse
import os
import sys
import time
import traceback

# (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_stages, num_warps) kept by --autotune pruned: the
# square 128 tiles and the 128 x 256 tile in the two warp counts the reference lists, the tiles a
# Hopper GEMM of these sizes usually picks. Configurations not in the reference's list are ignored.
PRUNED_CONFIGS = {(128, 128, 64, 3, 8), (128, 256, 64, 3, 8), (128, 128, 64, 4, 4), (64, 128, 64, 3, 4)}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", required=True, help="directory holding the reference's dion/ package")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="every dimension / 8 (plumbing only)")
    p.add_argument("--reps", type=int, default=10, help="timed calls per row")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="matmul peak for the ratio column")
    p.add_argument("--autotune", default="pruned", choices=["pruned", "full"])
    p.add_argument("--compile", action="store_true", help="leave the reference's torch.compile on")
    args = p.parse_args()
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def row(name, value, ratio="-"):
    print(f"| {name} | {value} | {ratio} |", flush=True)


def ortho_flops(batch, m, n):
    r, c = min(m, n), max(m, n)
    return batch * 5 * (2 * r * r * c + 2 * r * r * r + 2 * r * r * c)


def main():
    args = parse_args()
    if not args.compile:
        os.environ["TORCH_COMPILE_DISABLE"] = "1"
    import torch  # noqa: E402  (after TORCH_COMPILE_DISABLE)

    sys.path.insert(0, os.path.abspath(args.reference))
    try:
        import dion  # the reference package
        from dion import newton_schulz_triton as nst
        from dion import polar_express as pe
    except Exception as e:  # noqa: BLE001
        row("reference (microsoft/dion)", f"not importable from {args.reference}: {e!r}"[:160])
        return 0
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        row("reference (microsoft/dion)", "--device cuda but no CUDA device is visible")
        return 1
    s = 8 if args.quick else 1
    shapes = [(48, 768 // s, 768 // s), (12, 768 // s, 3072 // s), (12, 3072 // s, 768 // s)]
    compiled = "torch.compile on" if args.compile else "torch.compile off"
    triton_ok = dev.type == "cuda" and nst.TRITON_AVAILABLE
    if triton_ok and args.autotune == "pruned":
        for kernel in (nst.ns_line_1_kernel, nst.ns_line_2_kernel, nst.ns_line_3_kernel):
            kept = [c for c in kernel.configs
                    if (c.kwargs.get("BLOCK_SIZE_M"), c.kwargs.get("BLOCK_SIZE_N"), c.kwargs.get("BLOCK_SIZE_K"),
                        c.num_stages, c.num_warps) in PRUNED_CONFIGS]
            if kept:
                kernel.configs = kept
    tuned = f"autotune {args.autotune}"

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def time_it(fn, reps):
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return (time.perf_counter() - t0) / reps

    # ---- orthogonalizers
    orthos = [("newton_schulz_triton", nst.newton_schulz_triton, True, f"Triton, {tuned}"),
              ("polar_express_triton", pe.polar_express_triton, True, f"Triton, {tuned}, {compiled}"),
              ("zeropower_via_newtonschulz5", nst.zeropower_via_newtonschulz5, False, f"torch, {compiled}"),
              ("polar_express", pe.polar_express, False, f"torch, {compiled}")]
    for name, fn, needs_triton, how in orthos:
        label = f"reference {name} ({how})"
        if needs_triton and not triton_ok:
            row(f"reference {name}", "n/a: " + ("triton not importable" if dev.type == "cuda" else "CPU (Triton needs CUDA)"))
            continue
        try:
            flops, seconds = 0.0, 0.0
            with torch.no_grad():
                for shape in shapes:
                    G = torch.randn(shape, device=dev, dtype=torch.bfloat16)
                    flops += ortho_flops(*shape)
                    seconds += time_it(lambda: fn(G), args.reps)
            rate = flops / seconds
            ratio = f"{rate / (args.peak_tflops * 1e12):.2f}" if args.peak_tflops > 0 else "-"
            row(f"{label}, 160M matrix set ({seconds * 1e3:.2f} ms)", f"{rate * 1e-12:.3g} TFLOP/s", ratio)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            row(label, f"failed: {e!r}"[:160])

    # ---- optimizer step per class
    param_shapes = []
    for _ in range(12):
        param_shapes += [(768 // s, 768 // s)] * 4 + [(3072 // s, 768 // s), (768 // s, 3072 // s)]
    for cls in ("Muon", "NorMuon", "Dion2", "NorDion2", "Dion"):
        kw = {"lr": 0.02}
        if cls != "Dion" and triton_ok:
            kw["use_triton"] = True
        label = f"reference optimizer step {cls}{' (use_triton)' if kw.get('use_triton') else ''}, {compiled}, 160M matrix set"
        try:
            params = []
            for shape in param_shapes:
                p = torch.nn.Parameter(torch.randn(shape, device=dev) * 0.02)
                p.grad = torch.randn(shape, device=dev)
                params.append(p)
            opt = getattr(dion, cls)(params, **kw)
            opt.step()  # state creation; time_it adds one more untimed step
            row(label, f"{time_it(opt.step, args.reps) * 1e3:.2f} ms", "-")
            del opt, params
        except Exception as e:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            row(label, f"failed: {e!r}"[:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
