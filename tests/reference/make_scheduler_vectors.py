#!/usr/bin/env python3
"""Record scheduled-run vectors from microsoft/dion: each optimizer class under an LR scheduler.

What it is: the script that produced tests/vectors/reference/scheduled/*.safetensors. The cases and
the run itself are tests/python/scheduled_runs.py (shared with the test that replays them,
tests/python/test_scheduled.py); this script runs them with the reference and writes the
initial parameters, every step's gradients, and after every step the parameters, each group's
lr (float32) and the optimizer state.

What it is not: it neither fetches nor builds the reference. Point PYTHONPATH at a checkout of
microsoft/dion (the commit used is recorded in each file's metadata) and run:

    TORCH_COMPILE_DISABLE=1 PYTHONPATH=/path/to/dion python3 tests/reference/make_scheduler_vectors.py \
        --out tests/vectors/reference/scheduled

File format and tensor names as make_vectors.py (p{i}.init, g{i}.s{t}, p{i}.s{t}, and
st{i}.{key}.s{t} at every 10th step), plus lr{g}.s{t}: group g's lr after step t's
scheduler step (s0: after the scheduler's construction, the lr of step 1).
"""
import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import dion  # noqa: E402  (the reference, from PYTHONPATH)
import scheduled_runs  # noqa: E402
from make_vectors import write_safetensors  # noqa: E402


STATE_EVERY = 10


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
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
    torch.set_num_threads(1)
    for case in scheduled_runs.CASES:
        init, grads = scheduled_runs.initial_values(case)
        tensors = {f"p{i}.init": v for i, v in enumerate(init)}
        for t, step_grads in enumerate(grads, start=1):
            tensors.update({f"g{i}.s{t}": g for i, g in enumerate(step_grads)})
        # State every STATE_EVERY steps only (the parameters and lrs of every step pin the run).
        tensors.update({k: v for k, v in scheduled_runs.run(dion, case, init, grads).items()
                        if not k.startswith("st") or int(k.rsplit(".s", 1)[1]) % STATE_EVERY == 0})
        meta = dict(case, reference_commit=commit, torch=torch.__version__)
        path = os.path.join(args.out, case["case"] + ".safetensors")
        write_safetensors(path, tensors, {"case": json.dumps(meta)})
        print(f"{case['case']}: {len(tensors)} tensors -> {path}")


if __name__ == "__main__":
    main()
