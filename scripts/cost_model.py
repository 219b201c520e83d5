#!/usr/bin/env python3
"""Cost model of one optimizer step: time and bytes per rank for Muon, Dion2 and Dion.

    python3 scripts/cost_model.py table --model llama3-405b --hw h100 --layout 8,64,8
    python3 scripts/cost_model.py plot --out docs/images/cost_model.png
    python3 scripts/cost_model.py check [--test-dist build/tests/test_dist]

What it models (docs/benchmarks.md, "Cost model"), for a transformer's matrix parameters
(per layer q [d, d], k and v [kv, d], o [d, d], gate and up [f, d], down [d, f]) on a
(dp, fs, tp) layout, W = dp * fs * tp ranks, shard group S = fs * tp:
  Muon     every matrix is gathered whole onto one rank of its shard group (all_to_all), 
           orthogonalized there (Polar Express, 5 (4 r^2 c + 2 r^3) flops, r = min, c = max),
           and scattered back; a megabatch of N same-shape matrices is spread over the W ranks
           of the dp x S grid, so a rank does ceil(N / W) of them (the scaling limit: past
           N ranks, more ranks do not shorten the step). Bytes: payload each rank passes to the
           collective (comm::CommStats' count): 2 x its shard of every matrix (gather +
           scatter), in the communication dtype.
  Dion2    the same for the selected fraction a of each matrix's rows: a x Muon's bytes,
           the orthogonalization on [a m, n].
  Dion     no whole matrix moves: per matrix P = M Q [m, r], all-reduced over the shards of
           n; its orthonormalization (Cholesky QR, about 4 m r^2); R = M^T P [n, r], all-
           reduced over the shards of m; with dp > 1 the compressed sync all-reduces P and R
           over dp. Flops 4 m n r per matrix, split over the S shards. Payload: the P and R
           tensors passed to all_reduce.
Time = compute + communication (no overlap: an upper bound): flops / matmul rate, and for each
collective the ring's link bytes (all_to_all (k-1)/k, all_reduce 2 (k-1)/k of the payload) /
link bandwidth, the link being NVLink inside a node of `gpus_per_node` and InfiniBand across.

What it is not: no memory-bandwidth term for the elementwise work, no overlap, no stragglers,
no attention or embedding parameters (AdamW / Lion: local, no communication).

`check` compares the byte formulas with what comm::CommStats counted in tests/test_dist's
2- and 4-rank runs (the lines the byte scenarios print on rank 0), exactly.
"""
import argparse
import math
import re
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
# nvlink / ib: bytes/s per GPU per direction (NVLink 4: 450 GB/s; 400 Gb/s InfiniBand NDR:
# 50 GB/s); cpu-here: this machine's one-core bf16 rate from dion-bench (about 1e12 on the
# batched products) and a loopback link of 2 GB/s (gloo over TCP, order of magnitude).
HARDWARE = {
    "h100": dict(matmul=600e12, nvlink=450e9, ib=50e9, gpus_per_node=8, latency=10e-6),
    "h200": dict(matmul=600e12, nvlink=450e9, ib=50e9, gpus_per_node=8, latency=10e-6),
    "cpu-here": dict(matmul=1.0e12, nvlink=2e9, ib=2e9, gpus_per_node=1024, latency=50e-6),
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

def step_cost(model, algo, dp, fs, tp, hw, fraction=0.25, rank_div=4, comm_bytes=2):
    """(seconds, payload bytes per rank, flops per rank) of one step.

    Ranks are laid out tp innermost, then fs, then dp: a tp group spans tp consecutive ranks,
    an fs group fs * tp, a dp group all W; a group inside one node uses NVLink, else IB."""
    W, S = dp * fs * tp, fs * tp
    flops = bytes_ = link_s = 0.0

    def link(payload, k, factor, span):  # ring over k ranks spanning `span` consecutive ranks
        if k <= 1:
            return 0.0
        bw = hw["nvlink"] if span <= hw["gpus_per_node"] else hw["ib"]
        return payload * factor * (k - 1) / k / bw + factor * (k - 1) * hw["latency"]

    for m, n, count in matrices(model):
        size = m * n * comm_bytes
        if algo in ("muon", "dion2"):
            a = 1.0 if algo == "muon" else fraction
            flops += math.ceil(count / W) * ortho_flops(max(1, round(a * m)), n)
            if S > 1:  # all_to_all gather + scatter of this replica's share of the megabatch
                payload = 2 * a * count * size / (S * dp)
                bytes_ += payload
                link_s += link(payload, S, 1, S)
            if dp > 1:  # replicas split the megabatch, then all_gather the results
                payload = a * count * size / (S * dp)
                bytes_ += payload
                link_s += link(payload * dp, dp, 1, W)
        else:  # dion
            r = max(1, int(min(m, n) / rank_div + 1e-9))
            flops += count * (4 * m * n * r / S + 2 * (m / fs) * r * r)
            if fs > 1:  # R = M^T P summed over the row shards: all_reduce [n / tp, r]
                payload = count * (n / tp) * r * comm_bytes
                bytes_ += payload
                link_s += link(payload, fs, 2, S)
            if tp > 1:  # P = M Q summed over the column shards: all_reduce [m / fs, r]
                payload = count * (m / fs) * r * comm_bytes
                bytes_ += payload
                link_s += link(payload, tp, 2, tp)
            if dp > 1:  # compressed sync of P and R over the replicas, or of the gradient
                # itself when that is smaller (rank_fraction 1), as the reference does
                mm, nn = m / fs, n / tp
                payload = count * min((mm + nn) * r, mm * nn) if rank_div > 1 else count * mm * nn
                payload *= comm_bytes
                bytes_ += payload
                link_s += link(payload, dp, 2, W)
    if algo == "dion" and dp > 1:
        bytes_ += 8  # two 4-byte all_reduces per step (measured: cmd_check)
    return flops / hw["matmul"] + link_s, bytes_, flops


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
        t, b, f = step_cost(model, algo, dp, fs, tp, hw, **kw)
        print(f"| {name} | {t * 1e3:.1f} | {b / 1e6:.1f} | {f / 1e9:.1f} |")


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
            t, b, _ = step_cost(model, algo, 1, fs, tp, hw, **kw)
            ts.append(t * 1e3)
            bs.append(b / 1e6)
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
                        step_cost(mats, "muon", 1, 2, 1, hw, comm_bytes=2)[1])
    failures += compare("dion2 0.25 fsdp 2 ranks", int(m.group(2)),
                        step_cost(mats, "dion2", 1, 2, 1, hw, fraction=0.25, comm_bytes=2)[1])
    # scenario_dion_ddp: these shapes, 3 steps, fp32 all_reduce of P and R (or the gradient).
    mats = [(64, 32, 3), (32, 48, 1), (40, 40, 1)]
    found = re.findall(r"dion ddp rank_fraction ([\d.]+): all_reduce bytes (\d+)", text)
    for i, (rf, measured) in enumerate(found):  # the 2-rank test prints first, then 4 ranks
        dp = 2 if i < 2 else 4
        pred = 3 * step_cost(mats, "dion", dp, 1, 1, hw, rank_div=1 / float(rf), comm_bytes=4)[1]
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
    c = sub.add_parser("check", help="bytes vs tests/test_dist's measured CommStats")
    c.add_argument("--test-dist", default="build/tests/test_dist")
    args = p.parse_args()
    return {"table": cmd_table, "plot": cmd_plot, "check": cmd_check}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
