#!/usr/bin/env python3
"""Cost model of one optimizer step: time and bytes per rank for Muon, Dion2 and Dion.

    python3 scripts/cost_model.py table --model llama3-405b --hw h100 --layout 8,64,8
    python3 scripts/cost_model.py plot --out docs/images/cost_model.png
    python3 scripts/cost_model.py check [--test-dist build/tests/test_dist]
    python3 scripts/cost_model.py check --bench build/dion_bench.jsonl [--markdown]

What it models (docs/benchmarks.md, "Cost model"), for a transformer's matrix parameters
(per layer q [d, d], k and v [kv, d], o [d, d], gate and up [f, d], down [d, f]) on a
(dp, fs, tp) layout, W = dp * fs * tp ranks, shard group S = fs * tp, rows sharded over fs:
  Muon     FSDP: every matrix assembled whole on its owner rank (one all_to_all of each
           rank's row shards of the megabatch, padded to a multiple of fs matrices), ortho-
           gonalized there (5 (4 r^2 c + 2 r^3) flops, r = min, c = max), sent back (a second
           all_to_all); DDP: each replica orthogonalizes ceil(N / dp) of a megabatch of N and
           all_gathers. Past N ranks more ranks do not shorten the step.
  Dion2    the same for the selected fraction a: the columns of a tall matrix (their L1 norms
           summed over the row shards first: an fp32 all_reduce [N, n]), the local top rows of
           a wide or square one (the default "local" selection scope).
  Dion     (src/optim/drivers/dion.cpp) P and R in the momentum's dtype (fp32). FSDP:
           P = M^T Q [n, r] partial over the row shards: all_to_all (reduce-scatter), ceil(N /
           fs) orthonormalized per rank, all_gather; Q's column norms all_reduced [N, r].
           FSDP x TP: P all_reduced over fs, gathered over tp, orthonormalized whole on every
           rank; R all_reduced over tp. DDP: P and R averaged (compressed) or the gradient, and
           P's QR split over the replicas (all_gather). Flops 8 m n r per matrix over S, plus
           about 4 a r^2 per orthonormalization.
  Every    the optimizer's 8-byte agreement all_reduce per axis of more than one rank, each
           step; an elementwise term (bytes of memory traffic per parameter element,
           elementwise_bytes()) at the elementwise bandwidth.
Bytes: the payload each rank passes to each collective kind (comm::CommStats' count).
Time = compute + communication (no overlap: an upper bound): flops / rate, and for each
collective a ring's bytes per rank (all_to_all (k-1)/k, all_gather (k-1), all_reduce 2 (k-1)/k
of the payload) / link bandwidth + a latency per ring step, the link being NVLink inside a node
of `gpus_per_node` and InfiniBand across, or per-kind rates when calibrated.

What it is not: no overlap, no stragglers, no Dion2 selection or small-kernel costs, no
attention or embedding parameters (AdamW / Lion: local, no communication). Checked by a run:
the FSDP and DDP bytes (exact); not: FSDP x TP and HSDP (from the code).

`check` compares the byte formulas with what comm::CommStats counted in tests/test_dist's
2- and 4-rank runs (the lines the byte scenarios print on rank 0), exactly; `check --bench`
with every row of `dion-bench dist` (bytes per kind, exactly, exit 1 otherwise) and reports the
time predicted by the cpu-here preset calibrated in that run against the measured wall and
CPU times.
"""
import argparse
import json
import math
import re
import statistics
import subprocess
import sys

# ---------------------------------------------------------------------------- inputs

MODELS = {  # d, layers, ffn, kv width, heads
    "gpt-d768": dict(d=768, layers=12, ffn=3072, kv=768),
    "llama3-8b": dict(d=4096, layers=32, ffn=14336, kv=1024),
    "llama3-70b": dict(d=8192, layers=80, ffn=28672, kv=1024),
    "llama3-405b": dict(d=16384, layers=126, ffn=53248, kv=1024),
}

# matmul: dense bf16 FLOP/s actually reached (about 0.6 of the H100/H200 datasheet's 989 T);
# ortho: the orthogonalizer's rate, its flops counted as the reference counts them (default:
# matmul; calibrated on the CPU, where the exact path at d = 256 reaches about half the matmul's);
# matmul_dion: legacy Dion's fp32 products (default: matmul); membw: bytes/s of elementwise
# work (about 0.75 of HBM3 / HBM3e's 3.35 / 4.8 TB/s); nvlink / ib: bytes/s per GPU per
# direction (NVLink 4: 450 GB/s; 400 Gb/s InfiniBand NDR: 50 GB/s). cpu-here: round values of
# this machine (one core: bf16 ~0.5 T, fp32 ~0.15 T, ~10 GB/s elementwise, Gloo over loopback
# ~1 GB/s); `check --bench` replaces them with the rates `dion-bench dist` measured in its run.
HARDWARE = {
    "h100": dict(matmul=600e12, membw=2.5e12, nvlink=450e9, ib=50e9, gpus_per_node=8, latency=10e-6),
    "h200": dict(matmul=600e12, membw=3.6e12, nvlink=450e9, ib=50e9, gpus_per_node=8, latency=10e-6),
    "cpu-here": dict(matmul=0.5e12, matmul_dion=0.15e12, membw=10e9, nvlink=1e9, ib=1e9, gpus_per_node=1024,
                     latency=100e-6),
}


def matrices(model):
    """[(m, n, count)] of the model's matrix parameters (a list of them is taken as is)."""
    if isinstance(model, list):
        return model
    d, L, f, kv = model["d"], model["layers"], model["ffn"], model["kv"]
    shapes = {(d, d): 2 * L, (kv, d): 2 * L, (f, d): 2 * L, (d, f): L}
    return [(m, n, c) for (m, n), c in shapes.items()]


def ortho_flops(m, n):
    r, c = min(m, n), max(m, n)
    return 5 * (4 * r * r * c + 2 * r ** 3)


# ---------------------------------------------------------------------------- the model

KINDS = ("all_to_all", "all_gather", "all_reduce")
# Per collective kind, over k ranks, for a payload p (what one rank passes in, as CommStats
# counts it): bytes a ring moves per rank, and the number of latency steps.
MOVED = {"all_to_all": lambda p, k: p * (k - 1) / k, "all_gather": lambda p, k: p * (k - 1),
         "all_reduce": lambda p, k: 2 * p * (k - 1) / k}
STEPS = {"all_to_all": lambda k: k - 1, "all_gather": lambda k: k - 1, "all_reduce": lambda k: 2 * (k - 1)}


def elementwise_bytes(algo, fraction):
    """Memory traffic per parameter element of one step's elementwise work, counted from the ATen
    ops of src/math (fp32 parameter and momentum, bf16 orthogonalizer input and output): Muon
    about 60 B (momentum 20, cast to bf16 6, stacking into and out of the megabatch 8, weight
    decay 8, update 14, and the result's cast); Dion2 the momentum and decay of every element (28)
    plus the rest for the selected fraction; legacy Dion about 52 (momentum 12, M -= P R^T 16,
    decay 8, X -= P Q^T 16). An estimate, not a count of every kernel."""
    if algo == "dion":
        return 52
    return 28 + 32 * (1.0 if algo == "muon" else fraction)


def selected(fraction, size):
    """Dion2's selected count of `size` slices (src/math/dion2.cpp dion2_num_selected)."""
    return min(size, max(1, math.ceil(fraction * size - 1e-9)))


def dion_rank(m, n, rank_fraction):
    """src/math/dion.cpp's dion_rank with rank_multiple_of 1."""
    return min(math.ceil(rank_fraction * min(m, n) - 1e-9), m, n)


def qr_flops(a, r):
    """Dion's randomized Cholesky QR of P [a, r] (sketch with 1.25 r rows, solve): about 4 a r^2."""
    return 4 * a * r * r


class Cost:
    """One step on one rank: seconds (compute + communication), payload bytes per collective
    kind, flops, and the compute and link seconds separately."""

    def __init__(self):
        self.bytes = {}
        self.flops = self.flops_dion = self.link_s = self.compute_s = 0.0

    @property
    def seconds(self):
        return self.compute_s + self.link_s

    @property
    def total_bytes(self):
        return sum(self.bytes.values())


def step_cost(model, algo, dp, fs, tp, hw, fraction=0.25, rank_div=4, comm_bytes=2, state_bytes=4):
    """The Cost of one step of `algo` on the (dp, fs, tp) layout.

    Ranks are laid out tp innermost, then fs, then dp: a tp group spans tp consecutive ranks,
    an fs group fs * tp, a dp group all W; a group inside one node uses NVLink, else IB (or the
    per-kind rates of hw["links"], when calibrated). comm_bytes: the orthogonalizer's
    communication dtype (bf16); state_bytes: legacy Dion's P and R, in the momentum's dtype."""
    W, S = dp * fs * tp, fs * tp
    c = Cost()
    c.elementwise_bytes = 0.0

    def send(kind, payload, k, span):  # one collective over k ranks spanning `span` ranks
        if k <= 1 or payload <= 0:
            return
        c.bytes[kind] = c.bytes.get(kind, 0) + payload
        if "links" in hw:
            bw, lat = hw["links"][kind]
        else:
            bw, lat = (hw["nvlink"] if span <= hw["gpus_per_node"] else hw["ib"]), hw["latency"]
        c.link_s += MOVED[kind](payload, k) / bw + STEPS[kind](k) * lat

    for m, n, count in matrices(model):
        # Elementwise passes over this rank's elements: all of them with replicas (DDP), a shard
        # with FSDP / TP.
        c.elementwise_bytes += count * math.ceil(m / fs) * math.ceil(n / tp) * elementwise_bytes(algo, fraction)
        if algo in ("muon", "dion2"):
            a = 1.0 if algo == "muon" else fraction
            tall = algo == "dion2" and m > n  # Dion2 selects along the shorter dim (rows if square)
            k = selected(a, n) if tall else selected(a, m)  # selected columns (tall) or rows
            c.flops += math.ceil(count / W) * ortho_flops(m if tall else k, k if tall else n)
            if S > 1 and tp == 1 and dp == 1:
                # FSDP, rows sharded: every matrix assembled on its owner (all_to_all of each
                # rank's row shards of the megabatch, padded to a multiple of fs matrices) and
                # sent back (a second all_to_all). Dion2 moves the selected slices: the selected
                # columns of a tall matrix (their L1 norms summed over the shards first), else
                # the top ceil(a x local rows) rows of each shard (the default "local" scope).
                rows = math.ceil(m / fs)
                chunk = rows * k if tall else (selected(a, rows) if algo == "dion2" else rows) * n
                send("all_to_all", 2 * math.ceil(count / fs) * fs * chunk * comm_bytes, fs, S)
                if tall:
                    send("all_reduce", count * n * 4, fs, S)
                elif algo == "dion2" and selected(a, rows) >= rows:
                    # The local scope would keep every row of each shard (fraction 1): the
                    # selection is then one process's (EXACT_GLOBAL, src/optim/drivers/dion2.cpp),
                    # from every shard's row norms (fp32, one all_gather), in one process's order.
                    send("all_gather", count * rows * 4, fs, S)
            elif S > 1:  # 2-D or HSDP (not measured here): the shard group's share of the megabatch
                payload = 2 * a * count * m * n * comm_bytes / (S * dp)
                send("all_to_all", payload, S, S)
                if dp > 1:
                    send("all_gather", payload / 2, dp, W)
            elif dp > 1 and count > 1:  # DDP: each replica orthogonalizes ceil(N / dp), all_gather
                # (a megabatch of one matrix is computed by every replica, no communication)
                send("all_gather", math.ceil(count / dp) * (m * k if tall else k * n) * comm_bytes, dp, W)
        else:  # legacy Dion (src/optim/drivers/dion.cpp, src/optim/collectives.cpp)
            r = dion_rank(m, n, 1.0 / rank_div)
            sb = state_bytes
            compressed = rank_div > 1 and (m + n) * r < m * n
            c.flops_dion += count * 8 * m * n * r / S  # M Q, M^T P, P R^T, P Q^T
            if S > 1:
                # Rows sharded over fs (columns over tp): Dion works on M^T, P = M^T Q [n, r]
                # is partial over the row shards.
                b_local = math.ceil(m / fs)
                if tp == 1:  # P reduce-scattered (all_to_all, summed), orthonormalized, gathered
                    per = math.ceil(count / fs)
                    c.flops_dion += per * qr_flops(n, r)
                    send("all_to_all", per * fs * n * r * sb, fs, S)
                    send("all_gather", per * n * r * sb, fs, S)
                    p_sync = per * n * r
                else:  # P all-reduced over fs, gathered over tp, R summed over tp
                    a_local = math.ceil(n / tp)
                    c.flops_dion += count * qr_flops(n, r)
                    send("all_reduce", count * a_local * r * sb, fs, S)
                    send("all_gather", count * a_local * r * sb, tp, tp)
                    send("all_reduce", count * b_local * r * sb, tp, tp)
                    p_sync = count * a_local * r
                send("all_reduce", count * r * sb, fs, S)  # Q's column norms over the row shards
                if dp > 1:  # HSDP: P and R averaged over the replicas, or the gradient
                    payload = (p_sync + count * b_local * r) if compressed else count * b_local * math.ceil(n / tp)
                    send("all_reduce", payload * sb, dp, W)
            else:
                c.flops_dion += count * qr_flops(max(m, n), r) if dp == 1 else \
                    math.ceil(count / dp) * qr_flops(max(m, n), r)
                if dp > 1:  # DDP: P and R averaged (compressed) or the gradient; P's QR split
                    send("all_reduce", count * ((m + n) * r if compressed else m * n) * sb, dp, W)
                    send("all_gather", math.ceil(count / dp) * max(m, n) * r * sb, dp, W)
    # Every step, the optimizer's "did any rank's description change?" check: one 8-byte
    # all_reduce per axis of more than one rank (src/optim/agreement.cpp).
    for k, span in ((tp, tp), (fs, S), (dp, W)):
        if k > 1:
            send("all_reduce", 8, k, span)
    c.compute_s = (c.flops / hw.get("ortho", hw["matmul"]) + c.flops_dion / hw.get("matmul_dion", hw["matmul"]) +
                   c.elementwise_bytes / hw["membw"])
    return c


# ---------------------------------------------------------------------------- commands

def cmd_table(args):
    model = MODELS[args.model]
    hw = HARDWARE[args.hw]
    dp, fs, tp = (int(x) for x in args.layout.split(","))
    print(f"{args.model} on {args.hw}, dp {dp} x fs {fs} x tp {tp} = {dp * fs * tp} ranks "
          "(predicted; time = compute + communication, no overlap)\n")
    print("| algorithm | step ms | payload MB per rank | GFLOP per rank |")
    print("|---|--:|--:|--:|")
    for name, algo, kw in variants():
        c = step_cost(model, algo, dp, fs, tp, hw, **kw)
        print(f"| {name} | {c.seconds * 1e3:.1f} | {c.total_bytes / 1e6:.1f} | "
              f"{(c.flops + c.flops_dion) / 1e9:.1f} |")


def variants():
    out = [("Muon", "muon", {})]
    out += [(f"Dion2 {a}", "dion2", {"fraction": a}) for a in (1.0, 0.5, 0.25, 0.125)]
    out += [(f"Dion rank 1/{k}", "dion", {"rank_div": k}) for k in (4, 16, 64)]
    return out


def cmd_plot(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    model = MODELS[args.model]
    hw = HARDWARE[args.hw]
    ranks = [8 * 2 ** i for i in range(10)]  # 8 .. 4096
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, algo, kw in variants():
        ts, bs = [], []
        for W in ranks:
            tp = 8 if W >= 64 else 1  # the paper's 405B layout: TP 8 inside a node, FSDP across
            fs = W // tp
            c = step_cost(model, algo, 1, fs, tp, hw, **kw)
            ts.append(c.seconds * 1e3)
            bs.append(c.total_bytes / 1e6)
        axes[0].plot(ranks, ts, marker="o", label=name)
        axes[1].plot(ranks, bs, marker="o", label=name)
    for ax, title in zip(axes, ["step time (ms), compute + communication",
                                "payload per rank (MB)"]):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks (tp 8 x fs; tp 1 below 64)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"cost model: {args.model} on {args.hw} (scripts/cost_model.py, predicted)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


def cmd_check(args):
    return check_bench(args) if args.bench else check_test_dist(args)


def set_matrices(set_name):
    """dion-bench's GPT parameter set "DxL": its block matrices (tools/dion-bench/gpt_params.h)."""
    d, layers = (int(x) for x in set_name.split("x"))
    return [(d, d, 4 * layers), (4 * d, d, layers), (d, 4 * d, layers)]


def calibrated(cal, clock="wall"):
    """The cpu-here preset calibrated by one world size of `dion-bench dist`: the orthogonalizer's
    rate (Muon, Dion2), legacy Dion's fp32 product rate and the elementwise bandwidth per rank,
    measured with every rank busy, and per
    collective kind a bandwidth and latency fitted to a plain collective of 4 KiB and of 8 MiB.
    clock "wall": rates from the slowest rank's wall time (for the step's wall time); "cpu": the
    compute rates from rank 0's CPU time (for the step's CPU time, the compute part alone)."""
    hw = dict(HARDWARE["cpu-here"])
    rates = cal if clock == "wall" else cal["cpu"]
    hw["matmul"] = rates["matmul_bf16_gflops"] * 1e9
    if "ortho_bf16_gflops" in rates:
        hw["ortho"] = rates["ortho_bf16_gflops"] * 1e9
    hw["matmul_dion"] = rates["matmul_fp32_gflops"] * 1e9
    hw["membw"] = rates["elementwise_gb_per_s"] * 1e9
    k = cal["world"]
    links = {}
    for kind in KINDS:
        pts = sorted((p["bytes"], p["ms"] / 1e3) for p in cal.get("links", []) if p["kind"] == kind)
        if len(pts) < 2 or k < 2:
            continue
        # The small payload's time is taken as latency alone; the large one's remainder as transfer.
        (_, t0), (p1, t1) = pts[0], pts[-1]
        lat = t0 / STEPS[kind](k)
        transfer = t1 - STEPS[kind](k) * lat
        bw = MOVED[kind](p1, k) / (transfer if transfer > 0.05 * t1 else t1)
        links[kind] = (bw, lat)
    if links:
        hw["links"] = links
    return hw


def layout_of(row):
    W = row["world"]
    return {"single": (1, 1, 1), "fsdp": (1, W, 1), "ddp": (W, 1, 1)}[row["layout"]]


def predict(row, set_name, hw):
    dp, fs, tp = layout_of(row)
    return step_cost(set_matrices(set_name), row["algo"], dp, fs, tp, hw, fraction=row["fraction"],
                     rank_div=1.0 / row["rank_fraction"], comm_bytes=2, state_bytes=4)


def check_bench(args):
    """`dion-bench dist` rows: bytes per collective kind exact (every rank), time predicted with
    the cpu-here preset calibrated in the same run, and its relative error."""
    with open(args.bench) as f:
        tables = [json.loads(line) for line in f if line.strip()]
    tables = [t for t in tables if t.get("table") == "dist"]
    if not tables:
        print(f"check: no 'dist' table in {args.bench} (run dion-bench --json FILE dist)")
        return 1
    failures = 0
    md = []
    for t in tables:
        cals = {c["world"]: calibrated(c) for c in t["calibration"]}
        cpu_cals = {c["world"]: calibrated(c, "cpu") for c in t["calibration"]}
        if args.markdown:
            md.append("| ranks | GFLOP/s per rank, wall (CPU): bf16 matmul / orthogonalizer / fp32 Dion matmul | "
                      "elementwise GB/s, wall (CPU) | all_to_all | all_gather | all_reduce |")
            md.append("|--:|--:|--:|--|--|--|")
            for c in t["calibration"]:
                hw, cc = cals[c["world"]], c["cpu"]
                cell = (lambda k: f"{hw['links'][k][0] / 1e9:.2f} GB/s, {hw['links'][k][1] * 1e6:.0f} us"
                        if "links" in hw and k in hw["links"] else "—")
                md.append(f"| {c['world']} | {c['matmul_bf16_gflops']:.0f} / {c['ortho_bf16_gflops']:.0f} / "
                          f"{c['matmul_fp32_gflops']:.0f} ({cc['matmul_bf16_gflops']:.0f} / "
                          f"{cc['ortho_bf16_gflops']:.0f} / {cc['matmul_fp32_gflops']:.0f}) | "
                          f"{c['elementwise_gb_per_s']:.1f} ({cc['elementwise_gb_per_s']:.1f}) | "
                          f"{cell('all_to_all')} | {cell('all_gather')} | {cell('all_reduce')} |")
            md.append("")
            md.append("| ranks | layout | variant | wall ms | predicted ms (compute + link) | error | "
                      "rank 0 CPU ms | compute at CPU rates | error | bytes per rank | model | |")
            md.append("|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
        errors, cpu_errors = {}, {}
        for row in t["rows"]:
            c = predict(row, t["set"], cals[row["world"]])
            want = {k: int(round(v)) for k, v in c.bytes.items()}
            got = {k: int(v) for k, v in row["bytes"].items()}
            same_ranks = len(set(row["bytes_per_rank"])) == 1
            ok = want == got and same_ranks
            failures += not ok
            err = (c.seconds * 1e3 - row["wall_ms"]) / row["wall_ms"]
            errors.setdefault(row["world"], []).append(abs(err))
            cc = predict(row, t["set"], cpu_cals[row["world"]])
            cpu_err = (cc.compute_s * 1e3 - row["cpu_ms"]) / row["cpu_ms"]
            cpu_errors.setdefault(row["world"], []).append(abs(cpu_err))
            name = f"{row['world']} {row['layout']} {row['variant']}"
            if not ok:
                print(f"check: {name}: bytes per kind measured {got} (per rank {row['bytes_per_rank']}), "
                      f"model {want}: MISMATCH")
            elif not args.markdown:
                print(f"{name}: bytes {sum(got.values())} exact; time measured {row['wall_ms']:.2f} ms, "
                      f"predicted {c.seconds * 1e3:.2f} ms ({err:+.0%})")
            if args.markdown:
                md.append(f"| {row['world']} | {row['layout']} | {row['variant']} | {row['wall_ms']:.1f} | "
                          f"{c.seconds * 1e3:.1f} ({c.compute_s * 1e3:.1f} + {c.link_s * 1e3:.1f}) | "
                          f"{err:+.0%} | {row['cpu_ms']:.1f} | {cc.compute_s * 1e3:.1f} | {cpu_err:+.0%} | "
                          f"{sum(got.values())} | {sum(want.values())} | "
                          f"{'exact' if ok else 'MISMATCH'} |")
        def spread(errs):
            return "; ".join(f"{w} rank(s): median |error| {statistics.median(e):.0%}, max {max(e):.0%}"
                             for w, e in sorted(errs.items()))
        summary = "wall time: " + spread(errors) + ". compute vs rank 0's CPU time: " + spread(cpu_errors)
        if args.markdown:
            md.append("")
            md.append(f"- error = (predicted - measured) / measured. {summary}")
            md.append(f"- bytes: {'every row exact' if not failures else f'{failures} row(s) MISMATCH'}")
            md.append("")
        else:
            print(summary)
    if args.markdown:
        print("\n".join(md))
    return 1 if failures else 0


def check_test_dist(args):
    """Payload bytes of the model vs comm::CommStats in tests/test_dist (exact)."""
    out = subprocess.run([args.test_dist, "--gtest_filter=Distributed.Dion2MovesFractionOfMuonBytes:"
                          "Distributed.DionDdpGradientAndCompressedSync*"],
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    failures = 0
    # Muon / Dion2, FSDP over 2 ranks, 4 matrices 64 x 64 fp32 (scenario_bytes).
    m = re.search(r"all_to_all bytes: muon (\d+), dion2\(fraction 0\.25\) (\d+)", text)
    if not m:
        print("check: the byte lines were not found in test_dist's output:\n" + text[-2000:])
        return 1
    hw = HARDWARE["cpu-here"]

    def compare(name, measured, pred):
        ok = measured == pred
        print(f"{name}: measured {measured} B, model {pred:.0f} B, {'exact' if ok else 'MISMATCH'}")
        return not ok

    # scenario_bytes: 4 matrices 64 x 64, FSDP rows over 2 ranks, one step; the all_to_all
    # payload in the communication dtype (OrthoConfig::dtype, bf16).
    mats = [(64, 64, 4)]
    failures += compare("muon fsdp 2 ranks", int(m.group(1)),
                        step_cost(mats, "muon", 1, 2, 1, hw, comm_bytes=2).bytes["all_to_all"])
    failures += compare("dion2 0.25 fsdp 2 ranks", int(m.group(2)),
                        step_cost(mats, "dion2", 1, 2, 1, hw, fraction=0.25, comm_bytes=2).bytes["all_to_all"])
    # scenario_dion_ddp: these shapes, 3 steps, fp32 all_reduce of P and R (or the gradient).
    mats = [(64, 32, 3), (32, 48, 1), (40, 40, 1)]
    found = re.findall(r"dion ddp rank_fraction ([\d.]+): all_reduce bytes (\d+)", text)
    for i, (rf, measured) in enumerate(found):  # the 2-rank test prints first, then 4 ranks
        dp = 2 if i < 2 else 4
        pred = 3 * step_cost(mats, "dion", dp, 1, 1, hw, rank_div=1 / float(rf), state_bytes=4).bytes["all_reduce"]
        failures += compare(f"dion ddp {dp} ranks rank_fraction {rf}", int(measured), pred)
    if len(found) != 4:
        print(f"check: expected 4 dion ddp lines (2 and 4 ranks), found {len(found)}")
        failures += 1
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="one layout, every algorithm")
    t.add_argument("--model", choices=MODELS, default="llama3-405b")
    t.add_argument("--hw", choices=HARDWARE, default="h100")
    t.add_argument("--layout", default="1,512,8", help="dp,fs,tp")
    pl = sub.add_parser("plot", help="step time and bytes vs ranks, 8 .. 4096")
    pl.add_argument("--model", choices=MODELS, default="llama3-405b")
    pl.add_argument("--hw", choices=HARDWARE, default="h100")
    pl.add_argument("--out", default="docs/images/cost_model.png")
    c = sub.add_parser("check", help="bytes (and time, with --bench) vs measured runs")
    c.add_argument("--test-dist", default="build/tests/test_dist",
                   help="without --bench: run tests/test_dist's byte scenarios and compare")
    c.add_argument("--bench", default="", help="a dion-bench --json file with a 'dist' table")
    c.add_argument("--markdown", action="store_true", help="with --bench: the docs' tables")
    args = p.parse_args()
    return {"table": cmd_table, "plot": cmd_plot, "check": cmd_check}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
