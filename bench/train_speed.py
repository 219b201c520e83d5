#!/usr/bin/env python3
"""dion-train's forward + backward (and whole step) against the reference's GPT, eager and compiled.

    PYTHONPATH=/tmp/dion_ref python3 bench/train_speed.py --dion-train build/dion-train \\
        --data-dir data/shakespeare [--sizes 2x128,4x256] [--dtypes fp32,bf16] [--rounds 3] \\
        [--json out.jsonl] [--markdown section.md]

For each model size (layers x width; 4 heads, sequence 128, batch 8, vocabulary 50304) and dtype
(fp32; bf16 = autocast on both sides, as train.py's autocast_ctx), one thread, four sides:
  - reference eager: microsoft/dion's models/gpt_model.py GPT and train.py's optimizer setup
    (Dion2 at fraction 0.25, AdamW for the embedding and lm_head; bench/reference_train.py
    builds them), in this process;
  - reference compiled: the same after the reference's own GPT.compile() (torch.compile); its
    first step, which compiles, is reported apart (first_step_s) and never timed;
  - ours fast / ours exact: `dion-train --model_kernels fast|exact` on the same config
    (metrics.jsonl's fwd_bwd_ms and ms_per_step), one process per round.
Each round runs every side for --steps steps (after one untimed step), the order reversed every
other round, so that the machine's load falls on all sides alike; a side's figure is the median
over all rounds' steps, of the wall clock (dion-train's step time is wall time). Forward +
backward is the loss and loss.backward() (ours: the same span, `fwd_bwd_ms`); the whole step
adds the optimizer step and zero_grad.
Peak memory: the peak resident set (ru_maxrss) of one process running 3 steps of that side alone
(a fresh Python process for the reference; dion-train itself for ours): whole processes, the
interpreter and LibTorch included on both sides.
Prints a markdown table (also to --markdown) and appends one JSON object to --json. Not a test:
nothing asserts on time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402
import reference_train  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dion-train", required=True, help="the dion-train binary")
    p.add_argument("--data-dir", required=True, help="token shards for dion-train (dion-data prepare)")
    p.add_argument("--sizes", default="2x128,4x256", help="LAYERSxWIDTH, comma-separated")
    p.add_argument("--dtypes", default="fp32,bf16", help="fp32, bf16 (comma-separated)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed steps per side and round")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    p.add_argument("--rss-worker", nargs=3, metavar=("MODE", "SIZE", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.size_list = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: '{args.sizes}': expected LAYERSxWIDTH[,LAYERSxWIDTH...], e.g. 2x128,4x256")
    for d in args.dtypes.split(","):
        if d not in ("fp32", "bf16"):
            p.error(f"--dtypes: '{d}': valid values are fp32, bf16")
    if args.rounds < 1 or args.steps < 1:
        p.error("--rounds and --steps must be at least 1")
    if not args.rss_worker:
        if not (os.path.isfile(args.dion_train) and os.access(args.dion_train, os.X_OK)):
            p.error(f"--dion-train: '{args.dion_train}' is not an executable file (build the dion-train target)")
        if not os.path.isdir(args.data_dir):
            p.error(f"--data-dir: '{args.data_dir}' is not a folder (dion-data prepare writes the shards)")
    return args


def model_args(layers, width):
    return argparse.Namespace(n_layer=layers, model_dim=width, n_head=4, seq=128, batch=8, vocab=50304)


class Reference:
    """The reference's GPT + optimizer; step() -> (fwd+bwd s, whole step s), wall clock."""

    def __init__(self, torch, margs, compiled, dtype):
        self.torch, self.margs, self.dtype = torch, margs, dtype
        self.model, self.opt = reference_train.reference_model(torch, margs, "dion2", compiled)
        self.first_step_s = self.step()[1]

    def step(self):
        torch, a = self.torch, self.margs
        x = torch.randint(0, a.vocab, (a.batch, a.seq))
        y = torch.randint(0, a.vocab, (a.batch, a.seq))
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bf16"):
            loss = self.model(x, y)
        loss.backward()
        t1 = time.perf_counter()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return t1 - t0, time.perf_counter() - t0


def ours_cmd(args, margs, dtype, kernels, steps, run_dir):
    return [args.dion_train, "--data_dir", args.data_dir, "--model_dim", str(margs.model_dim),
            "--n_layer", str(margs.n_layer), "--n_head", str(margs.n_head), "--sequence_length", str(margs.seq),
            "--batch_size", str(margs.batch), "--device_batch_size", str(margs.batch),
            "--val_tokens", str(margs.batch * margs.seq), "--val_loss_every", "0", "--num_iterations", str(steps),
            "--warmup_ratio", "0", "--dtype", dtype, "--model_kernels", kernels, "--optimizer", "dion2",
            "--scalar_opt", "adamw", "--ortho_fraction", "0.25", "--log_every", "1000", "--run_dir", run_dir,
            "--checkpoint_freq", "0"]


def run_ours(args, margs, dtype, kernels, steps, work):
    """dion-train for 1 + steps steps: ([(fwd+bwd s, step s)] of the timed steps, peak RSS MiB)."""
    run_dir = tempfile.mkdtemp(dir=work)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with open(os.path.join(run_dir, "out.txt"), "w") as out:
        proc = subprocess.Popen(ours_cmd(args, margs, dtype, kernels, steps + 1, run_dir), env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        with open(os.path.join(run_dir, "out.txt")) as f:
            raise RuntimeError(f"dion-train exited {os.waitstatus_to_exitcode(status)}:\n{f.read()[-3000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(line) for line in f if '"kind": "train"' in line or '"kind":"train"' in line]
    return [(r["fwd_bwd_ms"] / 1e3, r["ms_per_step"] / 1e3) for r in recs[1:]], usage.ru_maxrss / 1024


def rss_worker(args):
    """One reference side alone for 3 steps; prints its peak RSS in MiB."""
    import resource
    import torch
    torch.set_num_threads(1)
    mode, size, dtype = args.rss_worker
    layers, width = (int(v) for v in size.split("x"))
    ref = Reference(torch, model_args(layers, width), mode == "compiled", dtype)
    ref.step()
    ref.step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return 0


def reference_rss(mode, layers, width, dtype):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--dion-train", "-", "--data-dir", "-",
                          "--rss-worker", mode, f"{layers}x{width}", dtype],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        raise RuntimeError(f"reference memory worker ({mode}) failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.split()[-1])


def measure(torch, args, layers, width, dtype, work):
    margs = model_args(layers, width)
    sides = {"reference eager": Reference(torch, margs, False, dtype),
             "reference compiled": Reference(torch, margs, True, dtype)}
    times = {k: [] for k in ("reference eager", "reference compiled", "ours fast", "ours exact")}
    rss = {}
    for r in range(args.rounds):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for side in order:
            if side in sides:
                sides[side].step()  # untimed
                times[side] += [sides[side].step() for _ in range(args.steps)]
            else:
                steps, peak = run_ours(args, margs, dtype, side.split()[1], args.steps, work)
                times[side] += steps
                rss[side] = max(rss.get(side, 0), peak)
        print(f"  {layers}x{width} {dtype}: round {r + 1}/{args.rounds} done, load {machine.loadavg()}", flush=True)
    if not args.no_memory:
        for side in sides:
            rss[side] = reference_rss(side.split()[1], layers, width, dtype)
    tokens = margs.batch * margs.seq
    row = {"size": f"{layers}x{width}", "dtype": dtype, "tokens_per_step": tokens,
           "compile_first_step_s": sides["reference compiled"].first_step_s}
    for side, ts in times.items():
        fb, st = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        row[side] = {"fwd_bwd_ms": fb * 1e3, "step_ms": st * 1e3, "fwd_bwd_tokens_per_s": tokens / fb,
                     "step_tokens_per_s": tokens / st, "fwd_bwd_ms_all": [t[0] * 1e3 for t in ts],
                     "peak_rss_mib": rss.get(side)}
    for side in ("ours fast", "ours exact"):
        for base in ("reference eager", "reference compiled"):
            for what in ("fwd_bwd", "step"):
                row[f"{side} / {base} {what}"] = row[side][f"{what}_ms"] and row[base][f"{what}_ms"] / row[side][f"{what}_ms"]
    return row


def markdown(rows, info):
    lines = [f"- machine: {info}",
             "- one thread; 4 heads, sequence 128, batch 8, vocabulary 50304; Dion2 (fraction 0.25) + AdamW; wall "
             "clock, median over interleaved rounds; speedup = reference ms / ours ms (tokens/s ratio)",
             "",
             "| size | dtype | side | fwd+bwd ms | fwd+bwd tok/s | step ms | peak RSS MiB | fast fwd+bwd speedup | "
             "fast step speedup |",
             "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        for side in ("reference eager", "reference compiled", "ours exact", "ours fast"):
            s = row[side]
            sp_fb = sp_st = ""
            if side.startswith("reference"):
                sp_fb = f"{row['ours fast / ' + side + ' fwd_bwd']:.2f}x"
                sp_st = f"{row['ours fast / ' + side + ' step']:.2f}x"
            rss = "" if s["peak_rss_mib"] is None else f"{s['peak_rss_mib']:.0f}"
            name = side + (f" (first step {row['compile_first_step_s']:.1f} s)" if side == "reference compiled" else "")
            lines.append(f"| {row['size']} | {row['dtype']} | {name} | {s['fwd_bwd_ms']:.0f} | "
                         f"{s['fwd_bwd_tokens_per_s']:.0f} | {s['step_ms']:.0f} | {rss} | {sp_fb} | {sp_st} |")
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    if args.rss_worker:
        return rss_worker(args)
    import torch
    torch.set_num_threads(1)
    try:
        import dion  # noqa: F401
        from models.gpt_model import GPT  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print(f"train_speed: microsoft/dion's dion package or models/gpt_model.py is not importable ({e!r}): "
              "put a checkout on PYTHONPATH", file=sys.stderr)
        return 2
    load_before = machine.loadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dion_train_speed.") as work:
        for layers, width in args.size_list:
            for dtype in args.dtypes.split(","):
                try:
                    rows.append(measure(torch, args, layers, width, dtype, work))
                except RuntimeError as e:
                    print(f"train_speed: {e}", file=sys.stderr)
                    return 1
    info = machine.info(torch, load_before)
    md = markdown(rows, f"{info['cpu']} ({' '.join(info['cpu_flags'])}); load average {info['loadavg']}; "
                        f"torch {info['torch_version']}; {info['time_utc']}")
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    machine.append_json(args.json, {"table": "train_speed", "rows": rows, "machine": info})
    return 0


if __name__ == "__main__":
    sys.exit(main())
