#!/usr/bin/env python3
"""Convergence benchmark: the same byte-level GPT, data, batch, steps and schedule for every
optimizer, a learning-rate sweep each, seeds for the winners; val loss against steps and time.

    python3 bench/convergence.py [--quick | --smoke] [--out DIR] [--build DIR] [--jobs N]
    bench/convergence.sh ...     (the same, building dion-train and dion-data first)

What it runs (docs/convergence.md):
  data     Tiny Shakespeare (data/tinyshakespeare/input.txt) as byte shards: `dion-data prepare
           --tokenizer byte`, documents split on blank lines, 10% of them to val (one val and one
           train shard), written once into OUT/data.
  model    dion-train's GPT with vocab_size 320 (the byte vocabulary 257 rounded up to a multiple
           of 64); the preset's layers and width put most parameters in the hidden matrices (the
           split is printed and goes into the report).
  runs     for each optimizer of the preset, each learning rate of its grid with seed 0 (the
           sweep); then the best learning rate (lowest final val loss) with the preset's further
           seeds. Every run: scalar_opt adamw (the embedding and lm_head, as the reference's
           configs), time_optimizer on, one thread (OMP_NUM_THREADS=1), --jobs runs at a time.
  report   OUT/report.md: the parameter split, the machine, the sweep (final val loss per lr), and
           per optimizer the tuned lr, final val loss mean ± spread (half the range over seeds),
           steps and seconds to reach AdamW's final val loss (first validation at or below the
           mean of AdamW's seeds' final losses; mean curve over seeds), the optimizer's share of
           the step time (from the step lines, the first step left out), and the bytes the
           optimizer would send per step per rank at 8 ranks under FSDP (scripts/cost_model.py;
           NorMuon counted as Muon, NorDion2 as Dion2: the model has no rows for them; AdamW
           none: elementwise; the FSDP weight gathers and gradient reduce-scatters, the same for
           every optimizer, are not counted). OUT/val_loss_vs_step.png and
           OUT/val_loss_vs_time.png: every optimizer's tuned runs (mean over seeds). OUT/runs.json:
           every run's final numbers. A run that fails or diverges is listed with its error, and
           takes no part in the choice of lr.

Presets (--quick: about 10 minutes on two cores; full: about 60; --smoke: the plumbing only, two
optimizers, one lr, a few steps, for the test) are in PRESETS below. Re-running with the same OUT
reuses the runs that finished (their metrics.jsonl has the val line after the last step): delete OUT to
start over.

What it does not do: choose the schedule or batch per optimizer (one for all, by design), run on
more than one rank, or measure communication (the bytes are the cost model's).
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

VOCAB = 320  # 257 byte ids rounded up to a multiple of 64 (dion::train::vocab_round_up)

# name -> (dion-train keys, learning-rate grid). Fractions: Dion2 / NorDion2 selected fraction,
# Dion's rank fraction (key ortho_fraction).
OPTIMIZERS = {
    "adamw": ({"optimizer": "adamw"}, [0.001, 0.003, 0.01]),
    "muon": ({"optimizer": "muon"}, [0.01, 0.02, 0.04]),
    "normuon": ({"optimizer": "normuon"}, [0.01, 0.02, 0.04]),
    "dion2-0.25": ({"optimizer": "dion2", "ortho_fraction": 0.25}, [0.01, 0.02, 0.04]),
    "dion2-1": ({"optimizer": "dion2", "ortho_fraction": 1.0}, [0.01, 0.02, 0.04]),
    "dion3-0.25": ({"optimizer": "dion3", "ortho_fraction": 0.25}, [0.01, 0.02, 0.04]),
    "dion-0.25": ({"optimizer": "dion", "ortho_fraction": 0.25}, [0.01, 0.02, 0.04]),
}

PRESETS = {
    # Sized from 8-step runs on the 2-core machine of this project with other builds running
    # (Muon, one thread: 4x256 T128 B16 about 3 s a step, 4x128 T64 B16 about 0.5 s).
    "full": dict(n_layer=4, model_dim=256, n_head=4, sequence_length=128, batch_size=8,
                 num_iterations=250, val_loss_every=25, val_batches=8, seeds=3,
                 optimizers=list(OPTIMIZERS)),
    "quick": dict(n_layer=4, model_dim=128, n_head=4, sequence_length=64, batch_size=16,
                  num_iterations=80, val_loss_every=16, val_batches=4, seeds=2,
                  optimizers=list(OPTIMIZERS)),
    "smoke": dict(n_layer=1, model_dim=32, n_head=2, sequence_length=16, batch_size=2,
                  num_iterations=4, val_loss_every=2, val_batches=1, seeds=2,
                  optimizers=["adamw", "dion2-0.25"], lrs=1),
}


class BenchError(Exception):
    """A user-facing error: says what failed and where to look."""


# ---------------------------------------------------------------------------- model

def param_split(p):
    """(hidden matrices, embedding, lm_head) parameter counts of dion-train's GPT: per block q,
    k, v, o [d, d] and the MLP's c_fc [4d, d], c_proj [d, 4d]; wte and lm_head [V, d]."""
    d, L = p["model_dim"], p["n_layer"]
    return 12 * d * d * L, VOCAB * d, VOCAB * d


def cost_matrices(p):
    d, L = p["model_dim"], p["n_layer"]
    return [(d, d, 4 * L), (4 * d, d, L), (d, 4 * d, L)]


def fsdp_bytes(p, name):
    """Bytes the optimizer sends per step per rank at 8 ranks, FSDP (fs 8), from the cost model;
    None for AdamW (elementwise, no communication)."""
    import cost_model
    algo_keys = OPTIMIZERS[name][0]
    opt = algo_keys["optimizer"]
    if opt == "adamw":
        return None
    algo = {"muon": "muon", "normuon": "muon", "dion2": "dion2", "dion3": "dion2", "nordion2": "dion2",
            "dion": "dion"}[opt]
    frac = algo_keys.get("ortho_fraction", 0.25)
    c = cost_model.step_cost(cost_matrices(p), algo, 1, 8, 1, cost_model.HARDWARE["h100"], fraction=frac,
                             rank_div=round(1 / frac))
    return c.total_bytes


# ---------------------------------------------------------------------------- running

def run(cmd, what, log=None, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if log:
        with open(log, "w") as f:
            f.write(r.stdout)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-15:])
        raise BenchError(f"{what} failed (exit {r.returncode}){f'; log {log}' if log else ''}:\n{tail}")
    return r.stdout


def prepare_data(build, out):
    data = os.path.join(out, "data")
    if os.path.isfile(os.path.join(data, "fineweb_val_000000.bin")):
        return data
    text = os.path.join(ROOT, "data", "tinyshakespeare", "input.txt")
    if not os.path.isfile(text):
        raise BenchError(f"{text} is missing (the repository's Tiny Shakespeare copy; see data/README.md)")
    run([os.path.join(build, "dion-data"), "prepare", text, "-o", data, "--tokenizer", "byte",
         "--delimiter", "\\n\\n", "--val-fraction", "0.1", "--threads", "1", "-q", "--overwrite"],
        "dion-data prepare --tokenizer byte")
    return data


def run_dir_name(name, lr, seed):
    return f"{name}_lr{lr:g}_s{seed}"


def read_metrics(path):
    """(val [(step, loss, time_s)], last train step) of a metrics.jsonl; [] when absent."""
    val, last = [], -1
    if not os.path.isfile(path):
        return val, last
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue
            if j.get("kind") == "val":
                loss = j["val_loss"]
                val.append((j["step"], math.nan if loss is None else float(loss), float(j["time_s"])))
            elif j.get("kind") == "train":
                last = max(last, j["step"])
    by_step = {}
    for v in val:
        by_step[v[0]] = v  # a repeated step: the last line wins
    return sorted(by_step.values()), last


STEP_RE = re.compile(r"\| (\d+) ms/step .*\(fwd\+bwd (\d+) ms, optimizer (\d+) ms\)")


def optimizer_share(log):
    """Summed optimizer ms / summed step ms over the step lines of `log`, the first step left out."""
    opt = total = 0.0
    n = 0
    if not os.path.isfile(log):
        return None
    with open(log) as f:
        for line in f:
            m = STEP_RE.search(line)
            if not m:
                continue
            n += 1
            if n == 1:
                continue
            total += float(m.group(1))
            opt += float(m.group(3))
    return opt / total if total > 0 else None


def train_one(build, data, out, p, name, lr, seed):
    """One dion-train run; returns its record (final val loss, curve, optimizer share, error)."""
    rd = os.path.join(out, "runs", run_dir_name(name, lr, seed))
    metrics = os.path.join(rd, "metrics.jsonl")
    log = os.path.join(rd, "train.log")
    N = p["num_iterations"]
    val, last = read_metrics(metrics)
    rec = {"name": name, "lr": lr, "seed": seed, "run_dir": rd}
    if not (val and val[-1][0] == N and last == N - 1):  # a val line's step: steps done (0 .. N)
        os.makedirs(rd, exist_ok=True)
        if os.path.exists(metrics):
            os.remove(metrics)
        keys = dict(OPTIMIZERS[name][0])
        keys.update(scalar_opt="adamw", lr=lr, seed=seed, data_dir=data, run_dir=rd, vocab_size=VOCAB,
                    n_layer=p["n_layer"], model_dim=p["model_dim"], n_head=p["n_head"],
                    sequence_length=p["sequence_length"], batch_size=p["batch_size"],
                    device_batch_size=p["batch_size"], num_iterations=N, val_loss_every=p["val_loss_every"],
                    val_tokens=p["val_batches"] * p["batch_size"] * p["sequence_length"],
                    time_optimizer="true", log_every=1, checkpoint_freq=0, dtype="fp32",
                    replica_check_every=0)
        cmd = [os.path.join(build, "dion-train")]
        for k, v in keys.items():
            cmd += [f"--{k}", str(v)]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        try:
            run(cmd, f"dion-train {name} lr {lr:g} seed {seed}", log=log, env=env)
        except BenchError as e:
            rec["error"] = str(e).splitlines()[-1] if str(e).strip() else str(e)
        val, last = read_metrics(metrics)
    rec["val"] = val
    rec["final"] = val[-1][1] if val and val[-1][0] == N else math.nan
    if not math.isfinite(rec["final"]) and "error" not in rec:
        rec["error"] = f"no finite final val loss (see {log})"
    rec["seconds"] = val[-1][2] if val else math.nan
    rec["opt_share"] = optimizer_share(log)
    return rec


def run_all(build, data, out, p, jobs_list, jobs):
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = [pool.submit(train_one, build, data, out, p, *j) for j in jobs_list]
        recs = []
        for f in futs:
            r = f.result()
            recs.append(r)
            status = r.get("error") or f"final val {r['final']:.4f}, {r['seconds']:.0f} s"
            print(f"[convergence] {r['name']} lr {r['lr']:g} seed {r['seed']}: {status}", file=sys.stderr)
    return recs


# ---------------------------------------------------------------------------- report

def mean_curve(recs):
    """[(step, mean loss, mean time_s)] over the runs' common validation steps."""
    steps = None
    for r in recs:
        s = {v[0] for v in r["val"]}
        steps = s if steps is None else steps & s
    out = []
    for st in sorted(steps or []):
        ls = [next(v for v in r["val"] if v[0] == st) for r in recs]
        out.append((st, statistics.fmean(v[1] for v in ls), statistics.fmean(v[2] for v in ls)))
    return out


def first_reach(curve, target):
    for st, loss, t in curve:
        if loss <= target:
            return st, t  # a val line's step is the number of steps done
    return None, None


def fmt_bytes(b):
    if b is None:
        return "0 (elementwise)"
    for unit, k in (("MB", 1e6), ("KB", 1e3)):
        if b >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def plot(curves, out, xkey):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, curve in curves.items():
        if not curve:
            continue
        xs = [c[0] for c in curve] if xkey == "step" else [c[2] for c in curve]
        ax.plot(xs, [c[1] for c in curve], marker="o", markersize=3, label=name)
    later = [c[1] for curve in curves.values() for c in curve[1:] if math.isfinite(c[1])]
    if later:  # the step-0 loss (about ln 320) would flatten every difference that matters
        lo, hi = min(later), max(later)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.05 * (hi - lo + 1e-9))
    ax.set_xlabel("step" if xkey == "step" else "wall time (s)")
    ax.set_ylabel("val loss (nats / byte)")
    ax.set_title(f"byte-level Tiny Shakespeare: val loss vs {'step' if xkey == 'step' else 'wall time'}")
    ax.grid(alpha=0.3)
    ax.legend()
    path = os.path.join(out, f"val_loss_vs_{'step' if xkey == 'step' else 'time'}.png")
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)
    return path


def report(p, preset, sweep, seeds_recs, out, seconds):
    import machine
    hidden, emb, head = param_split(p)
    total = hidden + emb + head
    lines = [f"# Convergence benchmark ({preset})", ""]
    model_cpu, _ = machine.cpu()
    lines += [f"Machine: {model_cpu or 'unknown CPU'}, {os.cpu_count()} cores, load average before "
              f"{p['load_before']}; {seconds:.0f} s this invocation (runs that had finished are reused).", ""]
    lines += [f"Model: {p['n_layer']} layers x {p['model_dim']} wide, {p['n_head']} heads, T {p['sequence_length']}, "
              f"vocab_size {VOCAB} (bytes); batch {p['batch_size']} sequences, {p['num_iterations']} steps, "
              f"validation every {p['val_loss_every']} steps on {p['val_batches'] * p['batch_size'] * p['sequence_length']} "
              f"tokens. Parameters: {total:,} = hidden matrices {hidden:,} ({100 * hidden / total:.1f}%) + "
              f"embedding {emb:,} + lm_head {head:,}. Schedule: dion-train's defaults for every optimizer (warmup "
              f"1%, linear warmdown over the last 20%, weight decay 0.01), scalar_opt adamw, fp32, one thread a run, "
              f"{p.get('jobs', 2)} runs at a time.", ""]
    by_name = {}
    for r in sweep:
        by_name.setdefault(r["name"], []).append(r)
    lines += ["## Sweep (seed 0, final val loss)", "", "| optimizer | " + " | ".join(["lr / final"] * 1) + " |",
              "|---|---|"]
    best = {}
    for name, rs in by_name.items():
        cells = []
        for r in rs:
            cells.append(f"{r['lr']:g}: " + (f"{r['final']:.4f}" if math.isfinite(r["final"]) else "failed"))
        ok = [r for r in rs if math.isfinite(r["final"])]
        if ok:
            best[name] = min(ok, key=lambda r: r["final"])["lr"]
            cells = [f"**{c}**" if c.startswith(f"{best[name]:g}:") else c for c in cells]
        lines.append(f"| {name} | " + ", ".join(cells) + " |")
    lines.append("")
    grid_edge = [n for n, lr in best.items() if len(by_name[n]) > 1 and lr in (by_name[n][0]["lr"], by_name[n][-1]["lr"])]
    if grid_edge:
        lines += [f"The best lr is at the edge of the grid for {', '.join(grid_edge)}: a wider sweep may find a better one.", ""]
    tuned = {}
    for name, lr in best.items():
        rs = [r for r in sweep + seeds_recs if r["name"] == name and r["lr"] == lr and math.isfinite(r["final"])]
        tuned[name] = rs
    curves = {name: mean_curve(rs) for name, rs in tuned.items()}
    adam = curves.get("adamw")
    adam_final = statistics.fmean(r["final"] for r in tuned["adamw"]) if tuned.get("adamw") else None
    adam_steps = first_reach(adam, adam_final)[0] if adam else None
    lines += ["## Tuned", "",
              "| optimizer | tuned lr | seeds | final val loss (mean ± half range) | steps to AdamW's final | "
              "x AdamW's steps | seconds to AdamW's final | optimizer share of step | optimizer bytes / step / rank, "
              "8 ranks FSDP |", "|---|---|---|---|---|---|---|---|---|"]
    for name in by_name:
        rs = tuned.get(name, [])
        if not rs:
            lines.append(f"| {name} | — | 0 | every run failed | | | | | |")
            continue
        finals = [r["final"] for r in rs]
        spread = (max(finals) - min(finals)) / 2
        st, secs = first_reach(curves[name], adam_final) if adam_final is not None else (None, None)
        ratio = f"{st / adam_steps:.2f}" if st and adam_steps else "—"
        shares = [r["opt_share"] for r in rs if r["opt_share"] is not None]
        share = f"{100 * statistics.fmean(shares):.0f}%" if shares else "—"
        lines.append(f"| {name} | {best[name]:g} | {len(rs)} | {statistics.fmean(finals):.4f} ± {spread:.4f} | "
                     f"{st if st else 'not reached'} | {ratio} | {f'{secs:.0f}' if secs else '—'} | {share} | "
                     f"{fmt_bytes(fsdp_bytes(p, name))} |")
    lines += ["", "Steps and seconds to AdamW's final: the first validation of the optimizer's mean curve (over its "
              "seeds) at or below the mean of AdamW's final val losses. Optimizer share: optimizer ms / step ms "
              "summed over the step lines (time_optimizer), the first step left out. Bytes: scripts/cost_model.py "
              "(FSDP, fs 8, bf16 orthogonalizer traffic, legacy Dion's fp32 P and R); NorMuon counted as Muon, "
              "Dion3/NorDion2 as Dion2; the FSDP weight gathers and gradient reduce-scatters, the same for every "
              "optimizer, are left out.", ""]
    failed = [r for r in sweep + seeds_recs if r.get("error")]
    if failed:
        lines += ["## Failed runs", ""] + [f"- {r['name']} lr {r['lr']:g} seed {r['seed']}: {r['error']}"
                                           for r in failed] + [""]
    step_png = plot(curves, out, "step")
    time_png = plot(curves, out, "time")
    lines += [f"![val loss vs step]({os.path.basename(step_png)})", "",
              f"![val loss vs wall time]({os.path.basename(time_png)})", ""]
    md = "\n".join(lines)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "runs.json"), "w") as f:
        json.dump({"preset": preset, "params": p, "runs": sweep + seeds_recs}, f, indent=1, default=str)
    return md


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the 10-minute version")
    mode.add_argument("--smoke", action="store_true", help="plumbing only: 2 optimizers, 1 lr, a few steps")
    ap.add_argument("--out", default="", help="output folder (default: runs/convergence[-quick|-smoke])")
    ap.add_argument("--build", default=os.environ.get("DION_BUILD_DIR", os.path.join(ROOT, "build")),
                    help="build folder with dion-train and dion-data")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    ap.add_argument("--optimizers", default="", help=f"comma-separated subset of {','.join(OPTIMIZERS)}")
    args = ap.parse_args()
    preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    p = dict(PRESETS[preset])
    if args.optimizers:
        names = args.optimizers.split(",")
        bad = [n for n in names if n not in OPTIMIZERS]
        if bad:
            raise BenchError(f"--optimizers: unknown {', '.join(bad)}; valid: {', '.join(OPTIMIZERS)}")
        p["optimizers"] = names
    if args.jobs < 1:
        raise BenchError(f"--jobs {args.jobs}: must be >= 1")
    p["jobs"] = args.jobs
    out = os.path.abspath(args.out or os.path.join(ROOT, "runs", "convergence" + ("" if preset == "full" else f"-{preset}")))
    for tool in ("dion-train", "dion-data"):
        if not os.access(os.path.join(args.build, tool), os.X_OK):
            raise BenchError(f"{os.path.join(args.build, tool)} is missing: build it (cmake --build {args.build} "
                             f"--target dion-train dion-data) or pass --build")
    os.makedirs(out, exist_ok=True)
    with open("/proc/loadavg") as f:
        p["load_before"] = " ".join(f.read().split()[:3])
    hidden, emb, head = param_split(p)
    print(f"[convergence] {preset}: {p['n_layer']}x{p['model_dim']}, parameters {hidden + emb + head:,}: hidden "
          f"{hidden:,} ({100 * hidden / (hidden + emb + head):.1f}%), embedding {emb:,}, lm_head {head:,}; out {out}",
          file=sys.stderr)
    t0 = time.time()
    data = prepare_data(args.build, out)
    lr_count = p.get("lrs", 3)
    sweep_jobs = [(n, lr, 0) for n in p["optimizers"] for lr in OPTIMIZERS[n][1][:lr_count]]
    if lr_count == 1:  # the middle of the grid
        sweep_jobs = [(n, OPTIMIZERS[n][1][1], 0) for n in p["optimizers"]]
    sweep = run_all(args.build, data, out, p, sweep_jobs, args.jobs)
    best = {}
    for r in sweep:
        if math.isfinite(r["final"]) and (r["name"] not in best or r["final"] < best[r["name"]]["final"]):
            best[r["name"]] = r
    seed_jobs = [(n, best[n]["lr"], s) for n in p["optimizers"] if n in best for s in range(1, p["seeds"])]
    seeds_recs = run_all(args.build, data, out, p, seed_jobs, args.jobs)
    md = report(p, preset, sweep, seeds_recs, out, time.time() - t0)
    print(md)
    print(f"[convergence] wrote {os.path.join(out, 'report.md')} and the PNGs beside it", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"convergence.py: error: {e}", file=sys.stderr)
        sys.exit(1)
