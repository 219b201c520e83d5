#!/usr/bin/env python3
"""tests/train/make_train_reference.py — train.py's own trajectories, for tests/train/test_numerics.cpp.

Dev-time only. It imports microsoft/dion's train.py (never committed here) from the checkout named
by --reference and runs its main() — its argument parsing, init_optimizer's parameter groups, its
get_lr schedule, its loop and its torch.nn.utils.get_total_norm — on the CPU, one process:

    git -C <dion mirror> archive HEAD | tar -x -C /tmp/dion_ref
    build/dion-data prepare -q -o /tmp/shakespeare_shards --shard-size 100000 \\
        --tokenizer data/gpt2 data/tinyshakespeare/input.txt
    python3 tests/train/make_train_reference.py --reference /tmp/dion_ref \\
        --data-dir /tmp/shakespeare_shards            # writes tests/vectors/train/train_reference.json
    ... --check                                       # reruns and compares with the saved file

train.py needs CUDA and torchrun; what this script changes around it, and nothing else:
  - torchrun's variables for one process (RANK 0, WORLD_SIZE 1, a free MASTER_PORT); CUDA reported
    available during init_distributed only (it asserts it); Gloo instead
    of NCCL, DDP without device_ids (a CPU module), Tensor.cuda() and to_empty(device="cuda") stay
    on the CPU, torch.cuda.synchronize / set_device are no-ops;
  - autocast(device_type="cuda") is a no-op: the CPU tensors compute in fp32 (dion-train's
    dtype fp32);
  - torch.manual_seed(SEED) before main() (train.py draws its init from an unseeded CUDA
    generator; dion-train seeds with its key seed, the same value);
  - TORCH_COMPILE_DISABLE=1 and --no_compile --no_triton (eager, as the C++ library);
  - wandb and tqdm are stubs; the stub's wandb.log records what train.py logs at full precision:
    train/loss (the step's last micro-batch; one micro-batch here, so the step's mean as
    dion-train's), train/grad_norm, val/loss.
What it records per run: train.py's flags, the 10 losses, grad norms (its get_total_norm, fp32;
and grad_norm_fp64: get_total_norm of the same gradients cast to float64, train.py's result
unchanged) and the final val loss.
"""
import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import types

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vectors", "train", "train_reference.json")
SEED = 1337  # dion-train's default seed
STEPS = 10
# 2 layers, 64 wide, 2 heads, T 64, one micro-batch of 4 sequences; warmdown over the last 2 steps.
COMMON = ["--model_dim", "64", "--n_layer", "2", "--n_head", "2", "--sequence_length", "64",
          "--batch_size", "4", "--device_batch_size", "4", "--num_iterations", str(STEPS),
          "--warmup_ratio", "0", "--warmdown_ratio", "0.2", "--lr", "0.02"]
RUNS = {
    "muon_adamw": ["--optimizer", "muon", "--scalar_opt", "adamw"],
    "dion2_lion": ["--optimizer", "dion2", "--scalar_opt", "lion"],
}
YAML = "val_tokens: 1024\nval_loss_every: 0\n"  # (no flags for these in train.py)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def install_stubs(logged):
    import importlib.machinery
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.run = types.SimpleNamespace(id="stub")
    wandb.login = lambda *a, **k: None
    wandb.init = lambda *a, **k: wandb.run
    wandb.log = lambda d, *a, **k: logged.append(dict(d))
    sys.modules["wandb"] = wandb
    tqdm = types.ModuleType("tqdm")
    tqdm.__spec__ = importlib.machinery.ModuleSpec("tqdm", None)

    class Bar:
        def __init__(self, *a, **k):
            pass

        def update(self, *a, **k):
            pass

        def set_postfix(self, *a, **k):
            pass

        def close(self):
            pass

    tqdm.tqdm = Bar
    sys.modules["tqdm"] = tqdm


norms_fp64 = []  # run_train_py: the float64 norm of each step's gradients


def run_train_py(reference, data_dir, flags):
    """train.py main() with `flags`; returns what it passed to wandb.log."""
    logged = []
    norms_fp64.clear()
    install_stubs(logged)
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    import torch
    import torch.distributed as dist
    sys.path.insert(0, reference)
    import train  # the reference's train.py

    # init_distributed asserts CUDA; everything after it asks torch.cuda truthfully (no GPU).
    init_distributed, available = train.init_distributed, torch.cuda.is_available

    def cpu_init_distributed(*a, **k):
        torch.cuda.is_available = lambda: True
        try:
            return init_distributed(*a, **k)
        finally:
            torch.cuda.is_available = available

    train.init_distributed = cpu_init_distributed
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.max_memory_allocated = lambda *a, **k: 0
    torch.Tensor.cuda = lambda self, *a, **k: self
    to_empty = torch.nn.Module.to_empty
    torch.nn.Module.to_empty = lambda self, *, device=None, **k: to_empty(
        self, device="cpu" if str(device).startswith("cuda") else device, **k)
    init_pg = dist.init_process_group
    train.dist.init_process_group = lambda *a, **k: init_pg(backend="gloo")
    autocast = torch.amp.autocast
    torch.amp.autocast = lambda device_type, *a, **k: (
        contextlib.nullcontext() if device_type == "cuda" else autocast(device_type, *a, **k))

    class CpuDDP(train.DDP):
        def __init__(self, module, device_ids=None, output_device=None, **k):
            super().__init__(module, **k)

    train.DDP = CpuDDP
    # train.py's get_total_norm, unchanged; beside it the same norm summed in float64 (what
    # dion-train computes), recorded as grad_norm_fp64.
    total_norm = torch.nn.utils.get_total_norm

    def recording_total_norm(tensors, *a, **k):
        tensors = list(tensors)
        exact = torch.nn.utils.get_total_norm.__wrapped_exact__([t.double() for t in tensors])
        norms_fp64.append(exact.item())
        return total_norm(tensors, *a, **k)

    recording_total_norm.__wrapped_exact__ = total_norm
    torch.nn.utils.get_total_norm = recording_total_norm
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(YAML)
        cfg = f.name
    sys.argv = ["train.py", "--config", cfg, "--data_dir", data_dir, "--no_compile", "--no_triton"] + flags
    torch.manual_seed(SEED)
    try:
        train.main()
    finally:
        os.unlink(cfg)
    return logged


def one_run(reference, data_dir, name):
    """One run in a fresh interpreter (train.py keeps module state; the process group is global)."""
    import subprocess
    out = subprocess.run([sys.executable, __file__, "--reference", reference, "--data-dir", data_dir,
                          "--child", name], capture_output=True, text=True,
                         env=dict(os.environ, TORCH_COMPILE_DISABLE="1", OMP_NUM_THREADS="1", **MKL_ENV[kernel_isa()]))
    if out.returncode != 0:
        sys.exit(f"train.py run {name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(reference, data_dir, name):
    flags = COMMON + RUNS[name]
    import io
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()  # train.py's prints
    try:
        logged = run_train_py(reference, data_dir, flags)
    finally:
        sys.stdout = real_stdout
    import torch
    train_logs = [d for d in logged if "train/loss" in d]
    val_logs = [d for d in logged if "val/loss" in d]
    print(json.dumps({
        "name": name,
        "train_py_flags": flags,
        "loss": [d["train/loss"] for d in train_logs],
        "grad_norm": [d["train/grad_norm"] for d in train_logs],
        "grad_norm_fp64": list(norms_fp64),
        "val_loss": val_logs[-1]["val/loss"],
        "torch": torch.__version__,
    }))


def capped_to_avx2() -> bool:
    """True when a kernel library is capped at AVX2 or below (scripts/test_avx2.sh's caps), as
    tests/support/cpu_kind.h's capped_to_avx2()."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").upper()
    mkl = os.environ.get("MKL_ENABLE_INSTRUCTIONS", "").upper()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return aten in ("AVX2", "DEFAULT") or mkl in ("AVX2", "AVX", "SSE4_2") or onednn in ("AVX2", "AVX", "SSE41")


def kernel_isa() -> str:
    """The family of fp32 CPU kernels a run takes: "amx" (an Intel Xeon with AMX, Sapphire Rapids
    and later: MKL takes its newest paths there), "avx512" (AVX-512 without AMX: an AMD EPYC Zen 4
    / Zen 5) or "avx2" (a CPU without AVX-512). They round fp32 sums differently, and 10 training
    steps carry that to ~5e-4 in the losses and grad norms (train.py against itself: AVX2-only
    EPYC vs the avx512 file 5.5e-4, this AMX Xeon vs it 4.9e-4, measured), so each family has its
    own recording (test_numerics.cpp picks it the same way, tests/support/cpu_kind.h).
    An AVX-512 CPU under the AVX2 caps is a family of its own, by vendor: MKL's AVX2 path on an
    Intel CPU is not its path on an AMD one (an AMX Xeon capped against the AVX2-only EPYC's file:
    2e-5 in the losses by step 10, measured 2026-12-06): "avx2cap_intel" or "avx2cap_amd"."""
    with open("/proc/cpuinfo") as f:
        lines = f.read().splitlines()
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    vendor = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("vendor_id")), "")
    if "avx512f" in flags and capped_to_avx2():
        return "avx2cap_intel" if vendor == "GenuineIntel" else "avx2cap_amd"
    if "amx_tile" in flags and "avx512f" in flags:
        return "amx"
    return "avx512" if "avx512f" in flags else "avx2"


# MKL's environment per family. On the AMX Xeon, MKL's default (CBWR "AUTO") branch rounds
# sgemm differently in two processes with the same inputs (train.py and dion-train drifted apart
# from step 1: 8.2e-5 in the losses over 10 steps); with MKL_CBWR=AVX512,STRICT both are
# deterministic and equal (0 in the losses, 3e-15 in the grad norms, measured 2026-12-04).
# test_numerics.cpp runs dion-train with the same setting.
MKL_ENV = {"amx": {"MKL_CBWR": "AVX512,STRICT"}, "avx512": {}, "avx2": {},
           "avx2cap_intel": {"MKL_CBWR": "AVX2,STRICT"}, "avx2cap_amd": {}}


def kernel_file() -> str:
    isa = kernel_isa()
    return OUT if isa == "avx512" else OUT.replace(".json", f"_{isa}.json")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reference", required=True, help="a checkout of microsoft/dion (holds train.py)")
    p.add_argument("--data-dir", required=True, help="Tiny Shakespeare GPT-2 shards of 100000 tokens (above)")
    p.add_argument("--check", action="store_true", help="compare with the saved file instead of writing it")
    p.add_argument("--out", default=None,
                   help="the file to write or check (default: the one for this CPU's kernels, kernel_file())")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = p.parse_args()
    if not os.path.isfile(os.path.join(a.reference, "train.py")):
        print(f"SKIP: {a.reference} holds no train.py (a checkout of microsoft/dion)")
        sys.exit(0)
    if a.child:
        child(os.path.abspath(a.reference), os.path.abspath(a.data_dir), a.child)
        return
    out = a.out or kernel_file()
    runs = [one_run(a.reference, a.data_dir, name) for name in RUNS]
    got = {"seed": SEED, "steps": STEPS, "torch": runs[0]["torch"],
           "yaml": YAML, "kernels": kernel_isa(), "runs": [{k: v for k, v in r.items() if k != "torch"} for r in runs]}
    if a.check:
        with open(out) as f:
            saved = json.load(f)
        worst = 0.0
        for s, g in zip(saved["runs"], got["runs"]):
            for key in ("loss", "grad_norm", "grad_norm_fp64"):
                for x, y in zip(s[key], g[key]):
                    worst = max(worst, abs(x - y) / abs(x))
        print(f"max relative difference from the saved file: {worst:.3g}")
        sys.exit(0 if worst <= 1e-6 else 1)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(got, f, indent=1)
        f.write("\n")
    for r in runs:
        fp32_vs_fp64 = max(abs(a - b) / b for a, b in zip(r["grad_norm"], r["grad_norm_fp64"]))
        print(f"{r['name']}: loss {r['loss'][0]:.7f} -> {r['loss'][-1]:.7f}, grad_norm[0] {r['grad_norm'][0]:.7f}, "
              f"val {r['val_loss']:.7f}; torch's fp32 grad norm vs float64: {fp32_vs_fp64:.2g}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
