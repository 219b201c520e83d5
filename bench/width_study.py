#!/usr/bin/env python3
"""Width study: does Dion2's gap to Muon at a small fraction shrink as the model grows?

    python3 bench/width_study.py [--quick | --smoke] [--out DIR] [--build DIR] [--jobs N] [--results DIR]
    bench/convergence.sh --width ...   (the same, building dion-train and dion-data first)

What it runs (docs/convergence.md "Width study"):
  model    dion-train's byte-level GPT (bench/convergence.py: data, vocabulary, one thread a run)
           at each width of the preset, the same depth, heads of 64, the same batch, sequence
           length and steps (so the same token budget, at least two passes over the train text).
  lrs      every optimizer tuned per width on seed 0: a grid of the preset's factors around the
           previous width's best (the first width: the preset's starting grid); a best lr at an
           edge of a grid of two or more gets one more run beyond that edge. AdamW is tuned
           first at each width; the matrix optimizers then train the embedding and lm_head with
           AdamW at AdamW's tuned lr of that width (keys embed_lr, lm_head_lr), so that the
           matrices' lr and the scalars' lr are tuned apart.
  seeds    the tuned lr again with the further seeds; seed s sets both the initial weights
           (key seed) and the data order (key data_seed), so the optimizers of one seed see the
           same data and start from the same weights: a gap to Muon is taken per seed.
  steps    at the preset's schedule width, Muon and Dion2 0.25 again with shorter schedules of
           their own (fractions of the steps, each with its warmdown), every seed: the fewest
           steps whose final val loss reaches AdamW's final val loss, and the same in seconds.
  why      at the schedule width, Dion2 0.25 with mu 0.8 (error feedback settles in 1/(f (1-mu))
           steps: 80 at mu 0.95, 20 at 0.8) and Dion2 0.25 and Muon at twice the steps.
Everything is resumable: a run whose metrics.jsonl has its final val line is reused, so the
study can run in parts; delete OUT to start over. OUT/report.md, OUT/gap_vs_width.png and
OUT/runs.json (bench/width_report.py); the full preset copies them into bench/results/width
(--results), where they are committed.
"""
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import convergence  # noqa: E402
import width_report  # noqa: E402

BenchError = convergence.BenchError

STUDY_OPTIMIZERS = ["adamw", "muon", "dion2-1", "dion2-0.5", "dion2-0.25", "dion3-0.25"]
# The study's optimizers as dion-train keys (convergence.OPTIMIZERS, and Dion2 at 0.5).
OPTIMIZER_KEYS = dict({n: keys for n, (keys, _) in convergence.OPTIMIZERS.items()},
                      **{"dion2-0.5": {"optimizer": "dion2", "ortho_fraction": 0.5}})
# Which runs start first when several are ready: AdamW's sweeps (every matrix optimizer's scalar
# lr waits on them), then width by width; the shorter schedules and the "why" runs (both at the
# first width, cheap) after the middle width, before the largest; within a width, optimizer by optimizer in this order (its sweep, then its seeds), so
# that a study stopped early has whole optimizers.
ORDER = ["adamw", "muon", "dion2-0.25", "dion2-1", "dion3-0.25", "dion2-0.5", "normuon"]
PHASE_AT = {"schedule": 1.5, "why": 1.6}
EDGE_FACTOR = 2.0  # a best lr at the edge of its grid: one more run beyond it, edge x or / this
START_LRS = {"adamw": [0.001, 0.002, 0.004], "matrix": [0.01, 0.02, 0.04]}

PRESETS = {
    # Sized from timed runs on this project's 2-core machine (AMD EPYC Zen 5, one thread a run,
    # load 1; ms a step at 2 layers, T 128, B 16): width 128 Muon 50, Dion2 47, AdamW 45; 256:
    # 151 / 131 / 129; 512: 568 / 443 / 435 (2026-12-05). 1000 steps x 2048 tokens = 2.05 passes
    # over the 997,084 train bytes. A full protocol at width 512 would take 4 of the 6 hours on two
    # cores: there the study runs AdamW (a 2-point grid, one seed), Muon and Dion2 0.25 (one lr each,
    # the lr tuned at 256: adjust_lr spectral_norm is the width transfer, two seeds); Dion2 0.5 runs
    # at width 128 only.
    "full": dict(widths=[128, 256, 512], n_layer=2, sequence_length=128, batch_size=16,
                 num_iterations=1000, val_loss_every=50, val_batches=8, optimizers=STUDY_OPTIMIZERS,
                 grid=[0.5, 1, 2],
                 per_width={256: dict(optimizers=["adamw", "muon", "dion2-1", "dion2-0.25", "dion3-0.25"]),
                            512: dict(grid=[1], adamw_grid=[0.5, 1], seeds=2, adamw_seeds=1,
                                      optimizers=["adamw", "muon", "dion2-0.25"])},
                 seeds=3, schedule_width=128, schedule_fractions=[0.5, 0.625, 0.75, 0.875],
                 schedule_optimizers=["muon", "dion2-0.25"], why=True),
    "quick": dict(widths=[64, 128], n_layer=2, sequence_length=64, batch_size=16, num_iterations=150,
                  val_loss_every=25, val_batches=4, optimizers=["adamw", "muon", "dion2-1", "dion2-0.25"],
                  grid=[0.5, 1, 2], per_width={128: dict(grid=[1], adamw_grid=[1])}, seeds=2,
                  schedule_width=64, schedule_fractions=[0.5, 0.75], schedule_optimizers=["muon", "dion2-0.25"],
                  why=False),
    "smoke": dict(widths=[32, 64], n_layer=1, sequence_length=16, batch_size=2, num_iterations=4,
                  val_loss_every=2, val_batches=1, optimizers=["adamw", "muon", "dion2-0.25"], grid=[1, 2],
                  per_width={64: dict(grid=[1], adamw_grid=[1])}, seeds=2, schedule_width=32,
                  schedule_fractions=[0.5], schedule_optimizers=["dion2-0.25"], why=True),
}


def width_params(p, w):
    """The preset's model and run keys at width w (convergence.train_one's `p`)."""
    q = dict(p)
    q.update(model_dim=w, n_head=max(1, w // 64))
    return q


class Study:
    """The runs as a graph: a run is ready once the lrs it needs are tuned. `ready()` lists the
    runs that can start now and were not started; `record()` takes a finished one."""

    def __init__(self, p):
        self.p = p
        self.recs = {}       # run name -> record
        self.started = set()

    def setting(self, w, key, name):
        pw = self.p["per_width"].get(w, {})
        if key in ("grid", "seeds") and name == "adamw":  # AdamW's own, where the width sets one
            return pw.get("adamw_" + key, pw.get(key, self.p[key]))
        return pw.get(key, self.p[key])

    def done(self, w, name, lr):
        return self.recs.get(self.run_name(w, name, lr, 0))

    def sweep_lrs(self, i, name):
        """The seed-0 lrs at width i: the grid, and once it finished with its best at an edge, one
        more lr beyond that edge (edge x 2 or edge / 2); None while the grid is not known yet."""
        lrs = self.grid(i, name)
        if lrs is None or len(lrs) < 2:
            return lrs
        runs = [self.done(self.p["widths"][i], name, lr) for lr in lrs]
        if any(r is None for r in runs):
            return lrs
        good = [r for r in runs if math.isfinite(r["final"])]
        best = min(good, key=lambda r: r["final"])["lr"] if good else None
        if best == min(lrs):
            return lrs + [round(best / EDGE_FACTOR, 10)]
        if best == max(lrs):
            return lrs + [round(best * EDGE_FACTOR, 10)]
        return lrs

    def tuned(self, i, name):
        """(lr, at the edge of what ran) once every seed-0 run of the width's sweep finished, else None."""
        lrs = self.sweep_lrs(i, name)
        if lrs is None:
            return None
        runs = [self.done(self.p["widths"][i], name, lr) for lr in lrs]
        if any(r is None for r in runs) or (len(lrs) > 1 and self.sweep_lrs(i, name) != lrs):
            return None
        ok = [r for r in runs if math.isfinite(r["final"])]
        if not ok:
            return (math.nan, False)
        best = min(ok, key=lambda r: r["final"])
        return best["lr"], len(lrs) > 1 and best["lr"] in (min(lrs), max(lrs))

    def grid(self, i, name):
        if i == 0:
            return START_LRS["adamw" if name == "adamw" else "matrix"]
        prev = self.tuned(i - 1, name)
        if prev is None or not math.isfinite(prev[0]):
            return None
        return [round(prev[0] * f, 10) for f in self.setting(self.p["widths"][i], "grid", name)]

    @staticmethod
    def run_name(w, name, lr, seed, variant=""):
        return f"w{w}/{name}_lr{lr:g}_s{seed}{variant}"

    def extra(self, i, name, seed):
        """The keys beside the preset's: data order from the seed; the scalars' lr from AdamW."""
        keys = dict(OPTIMIZER_KEYS[name], data_seed=seed)
        if name != "adamw":
            a = self.tuned(i, "adamw")
            if a is None or not math.isfinite(a[0]):
                return None
            keys.update(embed_lr=a[0], lm_head_lr=a[0])
        return keys

    def all_runs(self):
        """Every run the graph can define now: (priority, phase, width, name, lr, seed, variant, extra)."""
        p, out = self.p, []
        for i, w in enumerate(p["widths"]):
            for name in p["optimizers"]:
                if name not in self.setting(w, "optimizers", name):
                    continue
                lrs = self.sweep_lrs(i, name)
                if lrs is None:
                    continue
                ex = self.extra(i, name, 0)
                if ex is None:
                    continue
                out += [(self.priority("sweep", i, name), "sweep", w, name, lr, 0, "", ex) for lr in lrs]
                t = self.tuned(i, name)
                if t is None or not math.isfinite(t[0]):
                    continue
                for s in range(1, self.setting(w, "seeds", name)):
                    out.append((self.priority("seeds", i, name), "seeds", w, name, t[0], s, "", self.extra(i, name, s)))
                if w != p["schedule_width"]:
                    continue
                N = p["num_iterations"]
                for s in range(self.setting(w, "seeds", name)):
                    base = self.extra(i, name, s)
                    if name in p["schedule_optimizers"]:
                        for f in p["schedule_fractions"]:
                            n = max(1, round(N * f))
                            out.append((self.priority("schedule", i, name), "schedule", w, name, t[0], s, f"_n{n}",
                                        dict(base, num_iterations=n)))
                    if p["why"] and name in ("muon", "dion2-0.25"):
                        out.append((self.priority("why", i, name), "why", w, name, t[0], s, f"_n{2 * N}",
                                    dict(base, num_iterations=2 * N)))
                    if p["why"] and name == "dion2-0.25":
                        out.append((self.priority("why", i, name), "why", w, name, t[0], s, "_mu0.8", dict(base, mu=0.8)))
        return out

    @staticmethod
    def priority(phase, i, name):
        first = 0 if (phase == "sweep" and name == "adamw") else 1
        rank = ORDER.index(name) if name in ORDER else len(ORDER)
        return (first, PHASE_AT.get(phase, i), rank, phase == "seeds")

    def ready(self):
        runs = [r for r in self.all_runs() if self.run_name(*r[2:7]) not in self.started]
        return sorted(runs, key=lambda r: r[0])

    def record(self, run, rec):
        _, phase, w, name, lr, seed, variant, _ = run
        rec.update(width=w, variant=variant, phase=phase)
        self.recs[self.run_name(w, name, lr, seed, variant)] = rec


def run_study(build, data, out, p, jobs, train=True):
    """Every run the graph reaches (train False: only those that finished, nothing is trained)."""
    study = Study(p)

    def train_run(run, train=True):
        _, phase, w, name, lr, seed, variant, extra = run
        return convergence.train_one(build, data, out, width_params(p, w), phase, name, lr, seed, "exact", extra,
                                     study.run_name(w, name, lr, seed, variant), train=train)

    label = lambda run: study.run_name(*run[2:7])  # noqa: E731
    if train:
        convergence.run_graph(study, train_run, label, jobs, "width")
    else:
        convergence.finished_graph(study, lambda run: train_run(run, False), label)
    return study


def main():
    ap = convergence.common_args(__doc__, "width", "the 10-minute version (widths 64 and 128)",
                                 "plumbing only: tiny widths, a few steps")
    ap.add_argument("--report", action="store_true",
                    help="write the report from the runs that finished (a study in progress), train nothing")
    args = ap.parse_args()
    preset, out = convergence.settle_args(args, "width")
    p = dict(PRESETS[preset], jobs=args.jobs)
    os.makedirs(out, exist_ok=True)
    with open("/proc/loadavg") as f:
        p["load_before"] = " ".join(f.read().split()[:3])
    print(f"[width] {preset}: widths {p['widths']}, {p['n_layer']} layers, {p['num_iterations']} steps of "
          f"{p['batch_size']} x {p['sequence_length']} bytes; out {out}", file=sys.stderr)
    t0 = time.time()
    data = convergence.prepare_data(args.build, out)
    study = run_study(args.build, data, out, p, args.jobs, train=not args.report)
    with open("/proc/loadavg") as f:
        p["load_after"] = " ".join(f.read().split()[:3])
    md = width_report.report(p, preset, list(study.recs.values()), out, time.time() - t0)
    print(md)
    print(f"[width] wrote {os.path.join(out, 'report.md')} and gap_vs_width.png beside it", file=sys.stderr)
    convergence.publish(out, convergence.results_dir(args, preset, "width"),
                        ["report.md", "runs.json", "gap_vs_width.png"], "width")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"width_study.py: error: {e}", file=sys.stderr)
        sys.exit(1)
