#!/usr/bin/env python3
"""Convergence benchmark: the same byte-level GPT, data, batch, steps and schedule for every
optimizer, a learning-rate sweep each, seeds for the winners; val loss against steps and time.

    python3 bench/convergence.py [--quick | --smoke] [--out DIR] [--build DIR] [--jobs N] [--results DIR]
    bench/convergence.sh ...     (the same, building dion-train and dion-data first)

What it runs (docs/convergence.md):
  data     Tiny Shakespeare (data/tinyshakespeare/input.txt) as byte shards: `dion-data prepare
           --tokenizer byte`, documents split on blank lines, 10% of the tokens to val in whole
           documents (one val and one train shard), written once into OUT/data.
  model    dion-train's GPT with vocab_size 320 (the byte vocabulary 257 rounded up to a multiple
           of 64); the preset's layers and width put most parameters in the hidden matrices (the
           split is printed and goes into the report).
  runs     for each optimizer of the preset, each learning rate of its grid with seed 0 (the
           sweep: 5 values each); a best lr at the edge of its grid gets one more run beyond
           that edge (the extension: edge / 2 or edge x 2); then the best learning rate (lowest
           final val loss) with the preset's further seeds, and FAST_OPTIMIZERS (Muon, Dion2
           0.25) at their tuned lr with every seed again with ortho_path fast (the rest: exact).
           Every run: scalar_opt adamw (the embedding and lm_head, as the reference's configs),
           time_optimizer on, one thread (OMP_NUM_THREADS=1), --jobs runs at a time.
  report   OUT/report.md: the parameter split, the machine, the sweep (final val loss per lr), and
           per optimizer the tuned lr, final val loss mean ± spread (half the range over seeds),
           steps and seconds to reach AdamW's final val loss (first validation at or below the
           mean of AdamW's seeds' final losses; mean curve over seeds), the optimizer's share of
           the step time (from the step lines, the first step left out), and the bytes the
           optimizer would send per step per rank at 8 ranks under FSDP (scripts/cost_model.py;
           NorMuon counted as Muon, NorDion2 as Dion2: the model has no rows for them; AdamW
           none: elementwise; the FSDP weight gathers and gradient reduce-scatters, the same for
           every optimizer, are not counted); the fast vs exact table (bench/convergence_report.py).
           OUT/val_loss_vs_step.png and OUT/val_loss_vs_time.png: every optimizer's tuned runs
           (mean over seeds); OUT/val_loss_fast_vs_exact.png. OUT/runs.json: every run's final
           numbers. A run that fails or diverges is listed with its error, and takes no part in
           the choice of lr. The full preset copies report.md, runs.json and the PNGs into
           bench/results/convergence (--results), where they are committed.

Presets (--quick: under 10 minutes on two cores, 4 when quiet; full: 43 measured, at most 60; --smoke: the plumbing only, two
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
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import convergence_report  # noqa: E402

VOCAB = 320  # 257 byte ids rounded up to a multiple of 64 (dion::train::vocab_round_up)

# name -> (dion-train keys, learning-rate grid). Fractions: Dion2 / NorDion2 selected fraction,
# Dion's rank fraction (key ortho_fraction).
MATRIX_LRS = [0.005, 0.01, 0.02, 0.04, 0.08]
OPTIMIZERS = {
    "adamw": ({"optimizer": "adamw"}, [0.0005, 0.001, 0.002, 0.004, 0.008]),
    "muon": ({"optimizer": "muon"}, MATRIX_LRS),
    "normuon": ({"optimizer": "normuon"}, MATRIX_LRS),
    "dion2-0.25": ({"optimizer": "dion2", "ortho_fraction": 0.25}, MATRIX_LRS),
    "dion2-1": ({"optimizer": "dion2", "ortho_fraction": 1.0}, MATRIX_LRS),
    "dion3-0.25": ({"optimizer": "dion3", "ortho_fraction": 0.25}, MATRIX_LRS),
    "dion-0.25": ({"optimizer": "dion", "ortho_fraction": 0.25}, MATRIX_LRS),
}
# Beyond the grid: a tuned lr at its edge gets one more run at edge / 2 or edge x 2.
EDGE_FACTOR = 2.0
# Run again with ortho_path fast at the tuned lr, every seed (the rest run ortho_path exact).
FAST_OPTIMIZERS = ["muon", "dion2-0.25"]

PRESETS = {
    # Sized from 12-step timing runs (one thread each, two at a time, a -j2 build running beside
    # them) on this project's 2-core machine: 4x256 T128 B8 Muon 0.26 s a step, AdamW 0.19;
    # 4x128 T64 B16 Muon 0.086 s, AdamW 0.070 (2026-12-02). Validation every 1/20 of the
    # steps, so that "steps to AdamW's final / AdamW's steps" resolves 0.05 (0.75 is a validation).
    "full": dict(n_layer=4, model_dim=256, n_head=4, sequence_length=128, batch_size=8,
                 num_iterations=280, val_loss_every=14, val_batches=8, seeds=3,
                 optimizers=list(OPTIMIZERS)),
    "quick": dict(n_layer=4, model_dim=128, n_head=4, sequence_length=64, batch_size=16,
                  num_iterations=120, val_loss_every=6, val_batches=4, seeds=2,
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


def fsdp_bytes(p, name, ranks=8):
    """Bytes the optimizer sends per step per rank at `ranks` ranks, FSDP (fs = ranks), from the
    cost model; None for AdamW (elementwise, no communication)."""
    import cost_model
    algo_keys = OPTIMIZERS[name][0]
    opt = algo_keys["optimizer"]
    if opt == "adamw":
        return None
    algo = {"muon": "muon", "normuon": "muon", "dion2": "dion2", "dion3": "dion2", "nordion2": "dion2",
            "dion": "dion"}[opt]
    frac = algo_keys.get("ortho_fraction", 0.25)
    c = cost_model.step_cost(cost_matrices(p), algo, 1, ranks, 1, cost_model.HARDWARE["h100"], fraction=frac,
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


def run_dir_name(name, lr, seed, path="exact"):
    return f"{name}_lr{lr:g}_s{seed}" + ("_fast" if path == "fast" else "")


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


def train_one(build, data, out, p, phase, name, lr, seed, path="exact", extra=None, run_name=None, train=True):
    """One dion-train run; returns its record (final val loss, curve, optimizer share, error).
    `extra`: more dion-train keys (they win over the preset's); `run_name`: the run folder's
    name under OUT/runs (default: run_dir_name); train False: None unless it has finished."""
    rd = os.path.join(out, "runs", run_name or run_dir_name(name, lr, seed, path))
    metrics = os.path.join(rd, "metrics.jsonl")
    log = os.path.join(rd, "train.log")
    N = int((extra or {}).get("num_iterations", p["num_iterations"]))
    val, last = read_metrics(metrics)
    rec = {"name": name, "lr": lr, "seed": seed, "path": path, "phase": phase, "run_dir": rd, "steps": N}
    if not (val and val[-1][0] == N and last == N - 1):  # a val line's step: steps done (0 .. N)
        if not train:
            return None
        os.makedirs(rd, exist_ok=True)
        if os.path.exists(metrics):
            os.remove(metrics)
        keys = dict(OPTIMIZERS[name][0]) if name in OPTIMIZERS else {}  # else `extra` names the optimizer
        keys.update(scalar_opt="adamw", lr=lr, seed=seed, data_dir=data, run_dir=rd, vocab_size=VOCAB,
                    n_layer=p["n_layer"], model_dim=p["model_dim"], n_head=p["n_head"],
                    sequence_length=p["sequence_length"], batch_size=p["batch_size"],
                    device_batch_size=p["batch_size"], num_iterations=N, val_loss_every=p["val_loss_every"],
                    val_tokens=p["val_batches"] * p["batch_size"] * p["sequence_length"],
                    time_optimizer="true", log_every=1, checkpoint_freq=0, dtype="fp32",
                    replica_check_every=0, ortho_path=path)
        keys.update(extra or {})
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
            print(f"[convergence] {r['phase']}: {r['name']} lr {r['lr']:g} seed {r['seed']} {r['path']}: {status}",
                  file=sys.stderr, flush=True)
    return recs


def run_graph(study, train, label, jobs, tag):
    """A study's runs as a graph, `jobs` at a time: study.ready() lists the runs that can start now
    (those whose results they depend on are in) and are not in study.started; train(run) trains
    one and returns its record, study.record(run, rec) takes it, which may make more runs ready.
    label(run): the run's name in the progress lines."""
    import time
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        live = {}
        while True:
            for run in study.ready():
                if len(live) >= jobs:
                    break
                study.started.add(label(run))
                live[pool.submit(train, run)] = run
            if not live:
                return
            done, _ = concurrent.futures.wait(live, return_when=concurrent.futures.FIRST_COMPLETED)
            for fut in done:
                run = live.pop(fut)
                rec = fut.result()
                study.record(run, rec)
                status = rec.get("error") or f"final val {rec['final']:.4f}, {rec['seconds']:.0f} s"
                print(f"[{tag}] {time.time() - t0:6.0f} s  {run[1]}: {label(run)}: {status} ({len(study.recs)} runs done)",
                      file=sys.stderr, flush=True)


def finished_graph(study, finished, label):
    """--report: every run of the graph that has finished, in the graph's order (finished(run): its
    record, or None when it has not); nothing is trained."""
    progress = True
    while progress:
        progress = False
        for run in study.ready():
            study.started.add(label(run))
            rec = finished(run)
            if rec is not None:
                study.record(run, rec)
                progress = True


def common_args(doc, name, quick_help, smoke_help):
    """The arguments every convergence study takes: --quick | --smoke, --out, --build, --jobs."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help=quick_help)
    mode.add_argument("--smoke", action="store_true", help=smoke_help)
    ap.add_argument("--out", default="", help=f"output folder (default: runs/{name}[-quick|-smoke])")
    ap.add_argument("--build", default=os.environ.get("DION_BUILD_DIR", os.path.join(ROOT, "build")),
                    help="build folder with dion-train and dion-data")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    ap.add_argument("--results", default=None,
                    help="folder that the report, runs.json and PNGs are copied into, to be committed (default: "
                         "bench/results/STUDY for the full preset, none for --quick and --smoke; 'none': none)")
    return ap


def settle_args(args, name):
    """(preset, absolute out folder) after checking --jobs and the two programs."""
    if args.jobs < 1:
        raise BenchError(f"--jobs {args.jobs}: must be >= 1")
    for tool in ("dion-train", "dion-data"):
        if not os.access(os.path.join(args.build, tool), os.X_OK):
            raise BenchError(f"{os.path.join(args.build, tool)} is missing: build it (cmake --build {args.build} "
                             f"--target dion-train dion-data) or pass --build")
    preset = "smoke" if args.smoke else "quick" if args.quick else "full"
    return preset, os.path.abspath(args.out or os.path.join(ROOT, "runs", name + ("" if preset == "full" else f"-{preset}")))


def results_dir(args, preset, study):
    """The folder publish() copies into: --results, else bench/results/STUDY for the full preset; None: none."""
    r = args.results if args.results is not None else (
        os.path.join(ROOT, "bench", "results", study) if preset == "full" else "none")
    return None if r == "none" else os.path.abspath(r)


def publish(out, dest, names, tag):
    """Copies OUT's report files `names` (those that exist) into dest (bench/results/STUDY), so
    that the raw numbers behind the docs are committed; nothing when dest is None."""
    if not dest:
        return
    os.makedirs(dest, exist_ok=True)
    copied = [n for n in names if os.path.isfile(os.path.join(out, n))]
    for n in copied:
        shutil.copyfile(os.path.join(out, n), os.path.join(dest, n))
    print(f"[{tag}] copied {', '.join(copied)} to {dest} (commit them)", file=sys.stderr)


def main():
    ap = common_args(__doc__, "convergence", "the 10-minute version", "plumbing only: 2 optimizers, 1 lr, a few steps")
    ap.add_argument("--optimizers", default="", help=f"comma-separated subset of {','.join(OPTIMIZERS)}")
    args = ap.parse_args()
    preset, out = settle_args(args, "convergence")
    p = dict(PRESETS[preset])
    if args.optimizers:
        names = args.optimizers.split(",")
        bad = [n for n in names if n not in OPTIMIZERS]
        if bad:
            raise BenchError(f"--optimizers: unknown {', '.join(bad)}; valid: {', '.join(OPTIMIZERS)}")
        p["optimizers"] = names
    p["fast"] = [n for n in p.get("fast", FAST_OPTIMIZERS) if n in p["optimizers"]]
    p["jobs"] = args.jobs
    os.makedirs(out, exist_ok=True)
    with open("/proc/loadavg") as f:
        p["load_before"] = " ".join(f.read().split()[:3])
    hidden, emb, head = param_split(p)
    print(f"[convergence] {preset}: {p['n_layer']}x{p['model_dim']}, parameters {hidden + emb + head:,}: hidden "
          f"{hidden:,} ({100 * hidden / (hidden + emb + head):.1f}%), embedding {emb:,}, lm_head {head:,}; out {out}",
          file=sys.stderr)
    t0 = time.time()
    data = prepare_data(args.build, out)
    grids = {n: OPTIMIZERS[n][1] if p.get("lrs") != 1 else [OPTIMIZERS[n][1][len(OPTIMIZERS[n][1]) // 2]]
             for n in p["optimizers"]}
    recs = run_all(args.build, data, out, p, [("sweep", n, lr, 0) for n in p["optimizers"] for lr in grids[n]],
                   args.jobs)
    # A best lr at the edge of a grid of more than one: one more lr beyond that edge.
    ext = []
    for n, (lr, rs, edge) in convergence_report.tuned_lrs(recs).items():
        if edge and len(grids[n]) > 1:
            ext.append(("extension", n, lr / EDGE_FACTOR if lr == min(grids[n]) else lr * EDGE_FACTOR, 0))
    recs += run_all(args.build, data, out, p, ext, args.jobs)
    tuned = {n: lr for n, (lr, _, _) in convergence_report.tuned_lrs(recs).items() if lr is not None}
    later = [("seeds", n, tuned[n], s) for n in p["optimizers"] if n in tuned for s in range(1, p["seeds"])]
    later += [("fast", n, tuned[n], s, "fast") for n in p["fast"] if n in tuned for s in range(p["seeds"])]
    recs += run_all(args.build, data, out, p, later, args.jobs)
    with open("/proc/loadavg") as f:
        p["load_after"] = " ".join(f.read().split()[:3])
    md = convergence_report.report(p, preset, recs, out, time.time() - t0, fsdp_bytes, param_split, VOCAB)
    print(md)
    print(f"[convergence] wrote {os.path.join(out, 'report.md')} and the PNGs beside it", file=sys.stderr)
    publish(out, results_dir(args, preset, "convergence"), ["report.md", "runs.json", "val_loss_vs_step.png",
                                                            "val_loss_vs_time.png", "val_loss_fast_vs_exact.png"],
            "convergence")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"convergence.py: error: {e}", file=sys.stderr)
        sys.exit(1)
