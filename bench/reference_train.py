#!/usr/bin/env python3
"""The trainer's tokens/s against microsoft/dion's GPT model, eager and compiled, on the same CPU.

    PYTHONPATH=/tmp/dion_ref python3 bench/reference_train.py --dion-train build/dion-train \\
        --data-dir SHARDS --json out.jsonl

One small config for both sides (default: 4 layers, width 256, 4 heads, sequence 128, batch 8
in one micro-batch, vocabulary 50304, fp32, one thread, the embedding and lm_head on AdamW),
per matrix optimizer (default Muon and Dion2 at fraction 0.25, Newton-Schulz, as train.py):
  - reference: models/gpt_model.py's GPT (from the checkout on PYTHONPATH, fetched for the run
    and never committed) with the reference's optimizer class and train.py's parameter groups;
    run eagerly and (--reference-modes compiled, the default too) after the reference's own
    GPT.compile() (torch.compile of its forward; the first step, which compiles, is reported
    apart as first_step_s and never among the timed steps);
    each step is forward + backward + optimizer step + zero_grad on random tokens, timed on
    the wall clock and the process CPU clock (time.process_time), median of the steps after
    `--warmup`;
  - ours: `dion-train` on the same config (Tiny Shakespeare shards from --data-dir;
    OMP_NUM_THREADS=1). Wall time per step: the median of metrics.jsonl's ms_per_step after
    `--warmup` steps. CPU time per step: dion-train is run twice, for warmup + 1 and for
    warmup + 1 + steps steps, and the difference of the two processes' CPU times (getrusage of
    the children) is divided by `steps` (start-up, loading and the final validation cancel).
Both sides run one after the other in this process's run (reference, then ours, per optimizer);
the ratios (ours / reference tokens/s) are on both clocks. The token values do not change the
work, so the reference draws them at random.

Writes one JSON object (table "train") to --json (appended); when the reference is not
importable the table says why (and still holds our side). Not a test: nothing asserts on time.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dion-train", required=True, help="the dion-train binary")
    p.add_argument("--data-dir", required=True, help="shards for dion-train (dion-data prepare)")
    p.add_argument("--optimizers", default="muon,dion2", help="muon, dion2 (comma-separated)")
    p.add_argument("--model-dim", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=50304, help="the GPT-2 vocabulary dion-train uses")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--reference-modes", default="eager,compiled",
                   help="eager, compiled (torch.compile via the reference's GPT.compile; comma-separated)")
    p.add_argument("--json", default="")
    args = p.parse_args()
    for o in args.optimizers.split(","):
        if o not in ("muon", "dion2"):
            p.error(f"--optimizers: '{o}': valid values are muon, dion2")
    for m in args.reference_modes.split(","):
        if m not in ("eager", "compiled"):
            p.error(f"--reference-modes: '{m}': valid values are eager, compiled")
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1")
    if not (os.path.isfile(args.dion_train) and os.access(args.dion_train, os.X_OK)):
        p.error(f"--dion-train: '{args.dion_train}' is not an executable file (build the dion-train target)")
    if not os.path.isdir(args.data_dir):
        p.error(f"--data-dir: '{args.data_dir}' is not a folder (dion-data prepare writes the shards)")
    return args


# ---------------------------------------------------------------------------- reference side

def reference_model(torch, args, optimizer, compiled=False):
    """The reference's GPT (initialized under seed 0; GPT.compile()'d with `compiled`) and its
    optimizer over train.py's parameter groups: (model, optimizer), the model in train mode."""
    from models.gpt_model import GPT, GPTConfig
    import dion
    from dion.opt_utils import lm_head_lr_scale
    torch.manual_seed(0)
    model = GPT(GPTConfig(sequence_len=args.seq, vocab_size=args.vocab, n_layer=args.n_layer,
                          n_head=args.n_head, n_embd=args.model_dim))
    model.init_weights()
    if compiled:
        model.compile()  # the reference's own GPT.compile (torch.compile of its forward)
    lr, mu, wd = 0.02, 0.95, 0.01  # train.py's Hyperparameters defaults
    groups = [dict(params=list(model.transformer.h.parameters())),  # train.py's init_optimizer
              dict(params=list(model.transformer.wte.parameters()), algorithm="adamw", lr=lr,
                   betas=(0.95, 0.98), weight_decay=0),
              dict(params=list(model.lm_head.parameters()), algorithm="adamw",
                   lr=lr * lm_head_lr_scale("adamw", args.model_dim), betas=(0.95, 0.98), weight_decay=0)]
    if optimizer == "muon":
        opt = dion.Muon(groups, lr=lr, mu=mu, weight_decay=wd, nesterov=True, adjust_lr="spectral_norm",
                        use_triton=False, use_polar_express=False)
    else:
        opt = dion.Dion2(groups, lr=lr, fraction=0.25, ef_decay=mu, weight_decay=wd,
                         adjust_lr="spectral_norm", use_triton=False, use_polar_express=False)
    model.train()
    return model, opt


def reference_steps(torch, args, optimizer, compiled=False):
    """Wall and CPU seconds of each timed step of the reference's GPT + optimizer, and the wall
    seconds of the first step (with `compiled`, torch.compile's compile time is in it)."""
    model, opt = reference_model(torch, args, optimizer, compiled)
    wall, cpu, first = [], [], 0.0
    for i in range(args.warmup + args.steps):
        x = torch.randint(0, args.vocab, (args.batch, args.seq))
        y = torch.randint(0, args.vocab, (args.batch, args.seq))
        w0, c0 = time.perf_counter(), time.process_time()
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if i == 0:
            first = w
        if i >= args.warmup:
            wall.append(w)
            cpu.append(c)
    return wall, cpu, first


# ---------------------------------------------------------------------------- our side

def dion_train(args, optimizer, steps, work):
    """Run dion-train for `steps` steps; returns (ms_per_step list, CPU seconds of the process)."""
    run_dir = tempfile.mkdtemp(dir=work)
    cmd = [args.dion_train, "--data_dir", args.data_dir, "--model_dim", str(args.model_dim),
           "--n_layer", str(args.n_layer), "--n_head", str(args.n_head),
           "--sequence_length", str(args.seq), "--batch_size", str(args.batch),
           "--device_batch_size", str(args.batch), "--val_tokens", str(args.batch * args.seq),
           "--val_loss_every", "0", "--num_iterations", str(steps + 1), "--warmup_ratio", "0",
           "--dtype", "fp32", "--optimizer", optimizer, "--scalar_opt", "adamw",
           "--ortho_fraction", "0.25", "--log_every", "1000", "--run_dir", run_dir]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"dion-train exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if '"ms_per_step"' in line]
    return [r["ms_per_step"] for r in recs], cpu


def ours(args, optimizer, work):
    ms_long, cpu_long = dion_train(args, optimizer, args.warmup + args.steps, work)
    _, cpu_short = dion_train(args, optimizer, args.warmup, work)
    wall = [m / 1e3 for m in ms_long[args.warmup:]]
    return wall, [(cpu_long - cpu_short) / args.steps]


# ---------------------------------------------------------------------------- main

def side(wall, cpu, tokens, first=None):
    w, c = statistics.median(wall), statistics.median(cpu)
    extra = {} if first is None else {"first_step_s": first}
    return {**extra, "wall_ms": w * 1e3, "cpu_ms": c * 1e3, "tokens_per_s_wall": tokens / w, "tokens_per_s_cpu": tokens / c,
            "reps_wall_ms": [x * 1e3 for x in wall]}


def main():
    args = parse_args()
    modes = args.reference_modes.split(",")
    if "compiled" not in modes:
        os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # eager only
    import torch
    torch.set_num_threads(1)
    load_before = machine.loadavg()
    ref_error = ""
    try:
        import dion  # noqa: F401
        from models.gpt_model import GPT  # noqa: F401
    except Exception as e:  # noqa: BLE001
        ref_error = f"microsoft/dion's dion package or models/gpt_model.py is not importable: {e!r}"
        print(f"reference_train: {ref_error}; measuring dion-train alone", flush=True)
    tokens = args.batch * args.seq
    rows = []
    with tempfile.TemporaryDirectory(prefix="dion_reference_train.") as work:
        for optimizer in args.optimizers.split(","):
            row = {"optimizer": optimizer}
            if not ref_error:
                for mode in modes:
                    key = "reference" if mode == "eager" else "reference_compiled"
                    wall, cpu, first = reference_steps(torch, args, optimizer, compiled=(mode == "compiled"))
                    row[key] = side(wall, cpu, tokens, first)
            try:
                row["ours"] = side(*ours(args, optimizer, work), tokens)
            except RuntimeError as e:
                print(f"reference_train: {e}", file=sys.stderr)
                return 1
            for key, suffix in (("reference", ""), ("reference_compiled", "_compiled")):
                if key in row:
                    for clock in ("wall", "cpu"):
                        row[f"ratio_{clock}{suffix}"] = (row["ours"][f"tokens_per_s_{clock}"] /
                                                         row[key][f"tokens_per_s_{clock}"])
            rows.append(row)
            print(f"train {optimizer}: " + "; ".join(
                f"{k} {row[k]['tokens_per_s_wall']:.0f} tok/s wall, {row[k]['tokens_per_s_cpu']:.0f} tok/s CPU"
                for k in ("reference", "reference_compiled", "ours") if k in row), flush=True)
    table = {"table": "train", "rows": rows, "reference_error": ref_error,
             "config": {"model_dim": args.model_dim, "n_layer": args.n_layer, "n_head": args.n_head,
                        "sequence_length": args.seq, "batch": args.batch, "vocab": args.vocab,
                        "dtype": "fp32", "scalar_opt": "adamw", "steps": args.steps, "warmup": args.warmup,
                        "reference_modes": modes},
             "machine": machine.info(torch, load_before)}
    machine.append_json(args.json, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
