#!/usr/bin/env python3
"""Record reference test vectors from microsoft/dion, run on CPU in one process.

What it is: the script that produced tests/vectors/reference/*.safetensors. For every case below
it builds parameters and gradients from a seed, runs the reference optimizer for a few steps,
and writes the initial parameters, each step's gradients, and the parameters and optimizer
state after each step. tests/optim/test_reference.cpp replays the same steps through dion-cpp and
compares.

What it is not: it neither fetches nor builds the reference. Point PYTHONPATH at a checkout of
microsoft/dion (the commit used is recorded in each file's metadata) and run:

    TORCH_COMPILE_DISABLE=1 PYTHONPATH=/path/to/dion python3 tests/reference/make_vectors.py \
        --out tests/vectors/reference

The script pins the exact environment itself before torch runs a kernel (tests/python/exact_env.py:
ATen's scalar kernels, MKL's reproducible path, one thread, oneDNN off), so that the vectors
reproduce bit for bit on any x86-64 CPU with the same torch, and records it in every file's
metadata (tests/reference/README.md, "Exactness").

File format: safetensors (8-byte little-endian header length, a JSON header, raw tensor bytes).
The header's "__metadata__" holds {"case": json}, a JSON string with the case description.
Tensor names:
    p{i}.init             parameter i before step 1
    g{i}.s{t}             gradient of parameter i at step t (absent: no gradient that step)
    p{i}.s{t}             parameter i after step t
    st{i}.{key}.s{t}      optimizer state `key` of parameter i after step t
    st{i}.Q.s0            legacy Dion: Q right after state initialization
"""
import argparse
import json
import os
import platform
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import exact_env  # noqa: E402

exact_env.pin_variables()  # before torch's first kernel

import torch  # noqa: E402

import dion  # noqa: E402  (the reference, from PYTHONPATH)

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.float64: "F64"}
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------- the cases
# Each case: optimizer class name, constructor kwargs, parameter shapes, groups (indices +
# option overrides with the reference's keys), steps, optional missing gradients.
M = (16, 32)
CASES = []


def case(name, optimizer, shapes, groups=None, ctor=None, steps=5, dtype="float32",
         no_grad=None, zero_grad=(), seed=0, grad_scale=None):
    CASES.append(dict(
        case=name, optimizer=optimizer, ctor=ctor or {}, steps=steps, dtype=dtype,
        shapes=[list(s) for s in shapes],
        groups=groups or [{"params": list(range(len(shapes))), "options": {}}],
        no_grad=no_grad or {}, zero_grad=list(zero_grad), seed=seed,
        grad_scale=grad_scale or [1.0] * len(shapes)))


def mixed(n_matrix, extra=(("adamw", {}), ("lion", {}))):
    """Groups: matrices 0..n_matrix-1 in the default group, then one vector per scalar group."""
    groups = [{"params": list(range(n_matrix)), "options": {}}]
    for k, (algo, opts) in enumerate(extra):
        groups.append({"params": [n_matrix + k], "options": {"algorithm": algo, **opts}})
    return groups


base_shapes = [M, M, (32, 16), (24, 24), (32,), (8,)]
# Muon: a megabatch of two same-shape matrices, a tall and a square one, adamw + lion groups,
# a zero-gradient matrix, and a matrix without gradient on step 3.
case("muon_basic", "Muon", base_shapes + [M], groups=[
    {"params": [0, 1, 2, 3, 6], "options": {}},
    {"params": [4], "options": {"algorithm": "adamw", "lr": 0.003}},
    {"params": [5], "options": {"algorithm": "lion", "lr": 0.001}}],
    zero_grad=[6], no_grad={"3": [1]})
case("muon_nesterov_cwd", "Muon", base_shapes, groups=mixed(4, (("adamw", {"cautious_wd": True}),
                                                               ("lion", {"cautious_wd": True}))),
     ctor={"nesterov": True, "cautious_wd": True, "weight_decay": 0.1, "lr": 0.02})
case("muon_rms_norm", "Muon", base_shapes[:4], ctor={"adjust_lr": "rms_norm", "mu": 0.9})
case("muon_no_adjust", "Muon", base_shapes[:4], ctor={"adjust_lr": None})
case("muon_newton_schulz", "Muon", base_shapes[:4], ctor={"use_polar_express": False})
case("muon_num_heads", "Muon", [(32, 24), (32, 24)], groups=[
    {"params": [0, 1], "options": {"num_heads": 4}}])
case("muon_split_sizes", "Muon", [(32, 24), (16, 16)], groups=[
    {"params": [0], "options": {"split_sizes": [16, 8, 8]}},
    {"params": [1], "options": {}}])
case("muon_flatten_4d", "Muon", [(8, 4, 3, 3)], ctor={"flatten": True})
case("muon_batched_3d", "Muon", [(3, 8, 16), (3, 8, 16)])
case("muon_bf16", "Muon", base_shapes, groups=mixed(4), dtype="bfloat16")

case("normuon_basic", "NorMuon", base_shapes, groups=mixed(4))
case("normuon_nesterov_cwd", "NorMuon", base_shapes[:4],
     ctor={"nesterov": True, "cautious_wd": True, "muon_beta2": 0.9, "weight_decay": 0.1})
case("normuon_split_sizes", "NorMuon", [(32, 24)], groups=[
    {"params": [0], "options": {"split_sizes": [16, 8, 8]}}])
case("normuon_num_heads", "NorMuon", [(32, 24)], groups=[{"params": [0], "options": {"num_heads": 4}}])
case("normuon_rms_norm_3d", "NorMuon", [(2, 8, 16), (16, 8)], ctor={"adjust_lr": "rms_norm"})

case("dion2_basic", "Dion2", base_shapes + [M], groups=[
    {"params": [0, 1, 2, 3, 6], "options": {}},
    {"params": [4], "options": {"algorithm": "adamw", "lr": 0.003}},
    {"params": [5], "options": {"algorithm": "lion", "lr": 0.001}}],
    zero_grad=[6], no_grad={"2": [0]})
case("dion2_fraction_half", "Dion2", base_shapes[:4], ctor={"fraction": 0.5, "ef_decay": 0.9})
case("dion2_fraction_one", "Dion2", base_shapes[:4], ctor={"fraction": 1.0, "ef_decay": 0.0})
case("dion2_fraction_small", "Dion2", [(40, 64), (64, 40)], ctor={"fraction": 0.1, "ef_decay": 0.99,
                                                                  "adjust_lr": "rms_norm"})
case("dion2_num_heads", "Dion2", [(32, 24)], groups=[{"params": [0], "options": {"num_heads": 4}}])
case("dion2_batched_3d", "Dion2", [(3, 8, 16), (2, 16, 8)])
case("dion2_flatten_4d", "Dion2", [(8, 4, 3, 3)], ctor={"flatten": True})

case("nordion2_basic", "NorDion2", base_shapes, groups=mixed(4))
case("nordion2_fraction_half", "NorDion2", base_shapes[:4], ctor={"fraction": 0.5, "mu": 0.9,
                                                                  "muon_beta2": 0.8})
case("nordion2_num_heads", "NorDion2", [(32, 24)], groups=[{"params": [0], "options": {"num_heads": 4}}])
case("dion3_alias", "Dion3", base_shapes[:4], ctor={"fraction": 0.5})

case("dion_full_rank", "Dion", base_shapes + [M], groups=[
    {"params": [0, 1, 2, 3, 6], "options": {}},
    {"params": [4], "options": {"algorithm": "adamw", "lr": 0.003}},
    {"params": [5], "options": {"algorithm": "lion", "lr": 0.001}}], zero_grad=[6])
case("dion_low_rank", "Dion", [(64, 32), (32, 64), (48, 48)], ctor={"rank_fraction": 0.25})
case("dion_rank_multiple", "Dion", [(64, 32), (40, 64)], ctor={"rank_fraction": 0.3,
                                                               "rank_multiple_of": 4, "mu": 0.9})
case("dion_mixed_precision", "Dion", [(64, 32), (32, 32)], ctor={"rank_fraction": 0.5,
                                                                 "mixed_precision": "bfloat16"})


# ---------------------------------------------------------------------------- running a case
def build_optimizer(c, params):
    cls = getattr(dion, c["optimizer"])
    ctor = dict(c["ctor"])
    if ctor.pop("mixed_precision", None) == "bfloat16":
        ctor["mixed_precision_config"] = dion.DionMixedPrecisionConfig(
            momentum_dtype=torch.bfloat16, Q_dtype=torch.bfloat16)
    groups = []
    for g in c["groups"]:
        groups.append({"params": [params[i] for i in g["params"]], **g["options"]})
    return cls(groups, **ctor)


def run_case(c, commit):
    dtype = DTYPE_NAMES[c["dtype"]]
    gen = torch.Generator().manual_seed(c["seed"])
    params = []
    tensors = {}
    for i, shape in enumerate(c["shapes"]):
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.5).to(dtype))
        tensors[f"p{i}.init"] = p.detach().clone()
        params.append(p)
    grads = {}
    for t in range(1, c["steps"] + 1):
        for i, shape in enumerate(c["shapes"]):
            g = torch.randn(shape, generator=gen) * c["grad_scale"][i]
            if i in c["zero_grad"]:
                g = torch.zeros(shape)
            grads[(t, i)] = g.to(dtype)

    torch.manual_seed(c["seed"] + 1000)  # legacy Dion draws Q and its sketches from here
    opt = build_optimizer(c, params)
    if c["optimizer"] == "Dion":
        for group in opt.param_groups:
            for p in group["params"]:
                opt._get_or_initialize_state(p, group)
        for i, p in enumerate(params):
            if "Q" in opt.state[p]:
                tensors[f"st{i}.Q.s0"] = opt.state[p]["Q"].clone()

    for t in range(1, c["steps"] + 1):
        missing = set(c["no_grad"].get(str(t), []))
        for i, p in enumerate(params):
            if i in missing:
                p.grad = None
            else:
                p.grad = grads[(t, i)].clone()
                tensors[f"g{i}.s{t}"] = grads[(t, i)]
        opt.step()
        for i, p in enumerate(params):
            tensors[f"p{i}.s{t}"] = p.detach().clone()
            for key, val in opt.state[p].items():
                if isinstance(val, torch.Tensor):
                    tensors[f"st{i}.{key}.s{t}"] = val.detach().clone()
    # Where the result is reproducible bit for bit: the kernels' vector ISA and MKL's code path
    # (tests/reference/README.md, "Exactness").
    meta = dict(c, reference_commit=commit, **exact_env.here(torch), cpu=cpu_model())
    return tensors, {"case": json.dumps(meta)}


def cpu_model():
    """The CPU the vectors were recorded on (information only: the exact environment makes them
    reproducible on others)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--reference-commit", default=None,
                    help="the reference's commit (default: git rev-parse HEAD in its checkout)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ref_dir = os.path.dirname(os.path.dirname(os.path.abspath(dion.__file__)))
    commit = args.reference_commit
    try:
        commit = commit or subprocess.check_output(["git", "-C", ref_dir, "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        commit = "unknown"
    exact_env.pin_switches(torch)
    pinned = exact_env.here(torch)
    if pinned["cpu_capability"].lower() != "default" or pinned["mkldnn"] or pinned["threads"] != 1:
        sys.exit(f"make_vectors: the exact environment did not take: {pinned} (was torch imported first?)")
    only = set(args.only.split(",")) if args.only else None
    for c in CASES:
        if only and c["case"] not in only:
            continue
        tensors, meta = run_case(c, commit)
        path = os.path.join(args.out, c["case"] + ".safetensors")
        write_safetensors(path, tensors, meta)
        print(f"{c['case']}: {len(tensors)} tensors -> {path}")


if __name__ == "__main__":
    main()
