#!/usr/bin/env python3
"""Best against best: Muon and Dion2 0.25, each with its own tuned mu and lr, at equal steps and
equal time; and the width-128 control that separates Dion2's error feedback from mu itself.

    python3 bench/best_vs_best.py [--quick | --smoke] [--out DIR] [--build DIR] [--jobs N] [--results DIR] [--report]

What it runs (docs/convergence.md "Best against best"):
  model    dion-train's byte-level GPT of the width study (bench/convergence.py's data and
           vocabulary, one thread a run) at the preset's large width: 2 layers, heads of 64,
           T 128, batch 16, 1000 steps, `ortho_path fast`, the preset's dtype; the embedding and
           lm_head train with AdamW at one fixed lr (`embed_lr`, `lm_head_lr`), the same for all.
  timing   first, alone on the machine (nothing else of the study runs): Muon and Dion2 0.25,
           a short run each, one after the other; their median ms a step set the equal-time
           budget: Dion2 gets round(steps x Muon's ms / Dion2's ms) steps.
  mu       each optimizer at its mu grid (Muon 0.8 / 0.9 / 0.95, Dion2 0.25 0.7 / 0.8 / 0.9), lr 0.02;
           a best mu at an edge gets one more run beyond it (mu - 0.1 below, halfway to 1 above).
  lr       the best mu at half and double the lr; a best lr at an edge gets one more run beyond.
  seeds    each winner (mu, lr) with two more seeds (seed s moves the initial weights and the data
           order, the same for both optimizers, so gaps are paired by seed).
  time     the Dion2 winner for the equal-time steps (its own schedule), every seed.
  control  at the small width, the lr of Muon, Dion2 1 and Dion2 0.25 tuned at mu 0.95 (seed 0,
           grid 0.01 / 0.02 / 0.04), every seed at mu 0.95, and every seed at mu 0.8 at that lr.
Everything is resumable (a run with its final val line is reused); two runs at a time. OUT/report.md,
OUT/runs.json and OUT/best_vs_best.png; the full preset copies them into bench/results/best_vs_best.
"""
import json
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import convergence  # noqa: E402
import machine  # noqa: E402
import width_report  # noqa: E402

BenchError = convergence.BenchError
KEYS = {"muon": {"optimizer": "muon"},
        "dion2-0.25": {"optimizer": "dion2", "ortho_fraction": 0.25},
        "dion2-1": {"optimizer": "dion2", "ortho_fraction": 1.0}}

PRESETS = {
    # Sized on the 2-core Intel Xeon with AMX (2026-12-06, one thread a run, alone): width 512,
    # bf16, ortho_path fast: Muon 500 ms a step, Dion2 0.25 about 430; fp32 850 / 750. 17 runs at
    # 512 and 24 at 128, two at a time: about 95 minutes.
    "full": dict(width=512, control_width=128, n_layer=2, sequence_length=128, batch_size=16,
                 num_iterations=1000, val_loss_every=50, val_batches=8, dtype="bf16", scalar_lr=0.002,
                 mus={"muon": [0.8, 0.9, 0.95], "dion2-0.25": [0.7, 0.8, 0.9]}, base_lr=0.02,
                 lr_factors=[0.5, 2.0], seeds=3, timing_steps=60, control_lrs=[0.01, 0.02, 0.04],
                 control_optimizers=["muon", "dion2-1", "dion2-0.25"], control_mus=[0.95, 0.8]),
    "quick": dict(width=128, control_width=64, n_layer=2, sequence_length=64, batch_size=16,
                  num_iterations=150, val_loss_every=25, val_batches=4, dtype="fp32", scalar_lr=0.004,
                  mus={"muon": [0.8, 0.95], "dion2-0.25": [0.7, 0.9]}, base_lr=0.02, lr_factors=[0.5, 2.0],
                  seeds=2, timing_steps=20, control_lrs=[0.02, 0.04],
                  control_optimizers=["muon", "dion2-1", "dion2-0.25"], control_mus=[0.95, 0.8]),
    "smoke": dict(width=64, control_width=32, n_layer=1, sequence_length=16, batch_size=2,
                  num_iterations=4, val_loss_every=2, val_batches=1, dtype="fp32", scalar_lr=0.004,
                  mus={"muon": [0.8, 0.95], "dion2-0.25": [0.7, 0.9]}, base_lr=0.02, lr_factors=[2.0],
                  seeds=2, timing_steps=6, control_lrs=[0.02],
                  control_optimizers=["muon", "dion2-1", "dion2-0.25"], control_mus=[0.95, 0.8]),
}
EDGE_FACTOR = 2.0


def run_name(w, name, mu, lr, seed, steps=None):
    return f"w{w}/{name}_mu{mu:g}_lr{lr:g}_s{seed}" + (f"_n{steps}" if steps else "")


class Study:
    """The runs as a graph: a run is defined once the results it depends on are in."""

    def __init__(self, p):
        self.p = p
        self.recs = {}
        self.started = set()
        self.equal_time_steps = None

    def get(self, w, name, mu, lr, seed, steps=None):
        return self.recs.get(run_name(w, name, mu, lr, seed, steps))

    def best(self, runs):
        """The run of lowest final val loss among `runs` once all finished; None before."""
        if any(r is None for r in runs):
            return None
        good = [r for r in runs if math.isfinite(r["final"])]
        return min(good, key=lambda r: r["final"]) if good else {"final": math.nan, "lr": math.nan, "mu": math.nan}

    def lr_grid(self, w, name, mu, lrs):
        """`lrs` at seed 0, and one more beyond an edge where the best of them sits (once finished)."""
        b = self.best([self.get(w, name, mu, lr, 0) for lr in lrs])
        if b is None or not math.isfinite(b["final"]) or len(lrs) < 2:
            return lrs
        if b["lr"] == min(lrs):
            return sorted(lrs + [round(b["lr"] / EDGE_FACTOR, 10)])
        if b["lr"] == max(lrs):
            return sorted(lrs + [round(b["lr"] * EDGE_FACTOR, 10)])
        return lrs

    def tuned_lr(self, w, name, mu, lrs):
        """The best lr of `lrs` (with its edge run), None while runs are missing."""
        grid = self.lr_grid(w, name, mu, lrs)
        b = self.best([self.get(w, name, mu, lr, 0) for lr in grid])
        return None if b is None or self.lr_grid(w, name, mu, lrs) != grid else b

    def mu_grid(self, name):
        """The mu grid at the base lr, and once it finished with its best at an edge, one more mu
        beyond that edge (mu - 0.1 below; halfway to 1 above)."""
        p, mus = self.p, list(self.p["mus"][name])
        b = self.best([self.get(p["width"], name, mu, p["base_lr"], 0) for mu in mus])
        if b is None or not math.isfinite(b["final"]) or len(mus) < 2:
            return mus
        if b["mu"] == min(mus):
            return [round(b["mu"] - 0.1, 10)] + mus
        if b["mu"] == max(mus):
            return mus + [round(1 - (1 - b["mu"]) / 2, 10)]
        return mus

    def best_mu(self, name):
        p, mus = self.p, self.mu_grid(name)
        b = self.best([self.get(p["width"], name, mu, p["base_lr"], 0) for mu in mus])
        return None if b is None or self.mu_grid(name) != mus else b

    def winner(self, name):
        """(mu, lr) of the large width's best, None until its mu and lr runs finished."""
        m = self.best_mu(name)
        if m is None or not math.isfinite(m["final"]):
            return None
        lrs = sorted([self.p["base_lr"]] + [round(self.p["base_lr"] * f, 10) for f in self.p["lr_factors"]])
        b = self.tuned_lr(self.p["width"], name, m["mu"], lrs)
        return None if b is None or not math.isfinite(b["final"]) else (m["mu"], b["lr"])

    def all_runs(self):
        """Every run definable now: (priority, phase, width, name, mu, lr, seed, steps)."""
        p, w, out = self.p, self.p["width"], []
        for k, name in enumerate(p["mus"]):
            out += [((0, k, 0), "mu", w, name, mu, p["base_lr"], 0, None) for mu in self.mu_grid(name)]
            m = self.best_mu(name)
            if m is None or not math.isfinite(m["final"]):
                continue
            lrs = sorted([p["base_lr"]] + [round(p["base_lr"] * f, 10) for f in p["lr_factors"]])
            out += [((0, k, 1), "lr", w, name, m["mu"], lr, 0, None)
                    for lr in self.lr_grid(w, name, m["mu"], lrs) if lr != p["base_lr"]]
            win = self.winner(name)
            if win is None:
                continue
            out += [((0, k, 2), "seeds", w, name, win[0], win[1], s, None) for s in range(1, p["seeds"])]
            if name == "dion2-0.25" and self.equal_time_steps:
                out += [((0, k, 3), "time", w, name, win[0], win[1], s, self.equal_time_steps)
                        for s in range(p["seeds"])]
        cw = p["control_width"]
        for k, name in enumerate(p["control_optimizers"]):
            out += [((1, k, 0), "control", cw, name, 0.95, lr, 0, None)
                    for lr in self.lr_grid(cw, name, 0.95, p["control_lrs"])]
            b = self.tuned_lr(cw, name, 0.95, p["control_lrs"])
            if b is None or not math.isfinite(b["final"]):
                continue
            out += [((1, k, 2), "control", cw, name, mu, b["lr"], s, None)
                    for mu in p["control_mus"] for s in range(p["seeds"]) if (mu, s) != (0.95, 0)]
        return out

    def ready(self):
        runs = [r for r in self.all_runs() if run_name(*r[2:]) not in self.started]
        return sorted({run_name(*r[2:]): r for r in runs}.values(), key=lambda r: r[0])

    def record(self, run, rec):
        _, phase, w, name, mu, lr, seed, steps = run
        rec.update(width=w, mu=mu, phase=phase, run=run_name(w, name, mu, lr, seed, steps),
                   ms_per_step=width_report.step_ms(rec))
        self.recs[rec["run"]] = rec


def width_params(p, w):
    return dict(p, model_dim=w, n_head=max(1, w // 64))


def train(build, data, out, p, run, train=True):
    _, phase, w, name, mu, lr, seed, steps = run
    extra = dict(KEYS[name], mu=mu, data_seed=seed, embed_lr=p["scalar_lr"], lm_head_lr=p["scalar_lr"],
                 dtype=p["dtype"])
    if steps:
        extra["num_iterations"] = steps
    return convergence.train_one(build, data, out, width_params(p, w), phase, name, lr, seed, "fast", extra,
                                 run_name(w, name, mu, lr, seed, steps), train=train)


def timing(build, data, out, p):
    """Muon's and Dion2 0.25's median ms a step at the large width, one run at a time, alone."""
    ms = {}
    q = dict(p, num_iterations=p["timing_steps"], val_loss_every=p["timing_steps"])
    for name in ("muon", "dion2-0.25"):
        run = ((), "timing", p["width"], name, p["mus"][name][-1], p["base_lr"], 0, None)
        rec = convergence.train_one(build, data, os.path.join(out, "timing"), width_params(q, p["width"]), "timing",
                                    name, p["base_lr"], 0, "fast",
                                    dict(KEYS[name], embed_lr=p["scalar_lr"], lm_head_lr=p["scalar_lr"],
                                         dtype=p["dtype"]), run_name(*run[2:]))
        if rec.get("error"):
            raise BenchError(f"timing run {name}: {rec['error']}")
        ms[name] = width_report.step_ms(rec)
    return ms


def run_study(build, data, out, p, jobs, train_runs=True):
    study = Study(p)
    path = os.path.join(out, "timing.json")
    if os.path.isfile(path):
        study.timing = json.load(open(path))
    elif train_runs:
        print("[best] timing Muon and Dion2 0.25 alone (the equal-time budget)", file=sys.stderr, flush=True)
        study.timing = dict(timing(build, data, out, p), load=machine.loadavg())
        json.dump(study.timing, open(path, "w"))
    else:
        study.timing = None
    if study.timing:
        study.equal_time_steps = round(p["num_iterations"] * study.timing["muon"] / study.timing["dion2-0.25"])
    label = lambda run: run_name(*run[2:])  # noqa: E731
    if train_runs:
        convergence.run_graph(study, lambda run: train(build, data, out, p, run), label, jobs, "best")
    else:
        convergence.finished_graph(study, lambda run: train(build, data, out, p, run, train=False), label)
    return study


# ---------------------------------------------------------------------------- report

def gap(a, b):
    """Paired a - b by seed: (mean, half range, seeds) or None."""
    bs = {r["seed"]: r["final"] for r in b if math.isfinite(r["final"])}
    d = [r["final"] - bs[r["seed"]] for r in a if math.isfinite(r["final"]) and r["seed"] in bs]
    return (statistics.fmean(d), (max(d) - min(d)) / 2, len(d)) if d else None


def fmt_gap(g):
    return "—" if g is None else f"{g[0]:+.4f} ± {g[1]:.4f} ({g[2]} seed{'s' if g[2] != 1 else ''})"


def fmt_final(rs):
    xs = [r["final"] for r in rs if math.isfinite(r["final"])]
    return "—" if not xs else width_report.mean_hr(xs) if len(xs) > 1 else f"{xs[0]:.4f}"


def report(study, preset, out, seconds):
    p, recs = study.p, list(study.recs.values())
    w, cw, N = p["width"], p["control_width"], p["num_iterations"]
    model, flags = machine.cpu()
    L = [f"# Best against best: Muon and Dion2 0.25 ({preset} preset)", "",
         f"Machine: {model} ({', '.join(flags)}), one thread a run, {p['jobs']} at a time; "
         f"load before {p.get('load_before')}, after {p.get('load_after')}; {seconds:.0f} s this invocation.",
         f"Model: {p['n_layer']} layers, heads of 64, T {p['sequence_length']}, batch {p['batch_size']}, "
         f"{N} steps, dtype {p['dtype']}, ortho_path fast; embedding and lm_head AdamW at lr {p['scalar_lr']:g}.", ""]
    t = study.timing
    if t:
        L += [f"Timing (alone, {p['timing_steps']} steps each, median ms a step, load {t.get('load')}): "
              f"Muon {t['muon']:.0f} ms, Dion2 0.25 {t['dion2-0.25']:.0f} ms: the equal-time budget is "
              f"{study.equal_time_steps} Dion2 steps for Muon's {N}.", ""]
    L += [f"## Tuning at width {w} (seed 0)", "", "| optimizer | mu | lr | final val loss | |", "|---|---|---|---|---|"]
    wins = {}
    for name in p["mus"]:
        m, win = study.best_mu(name), study.winner(name)
        wins[name] = win
        rows = sorted((r for r in recs if r["width"] == w and r["name"] == name and r["phase"] in ("mu", "lr")),
                      key=lambda r: (r["mu"], r["lr"]))
        for r in rows:
            mark = []
            if win and (r["mu"], r["lr"]) == win:
                mark.append("**winner**")
                if r["mu"] in (min(study.mu_grid(name)), max(study.mu_grid(name))):
                    mark.append("mu at its grid's edge")
                lrs = [x["lr"] for x in rows if x["mu"] == r["mu"]]
                if len(lrs) > 1 and r["lr"] in (min(lrs), max(lrs)):
                    mark.append("lr at its grid's edge")
            L.append(f"| {name} | {r['mu']:g} | {r['lr']:g} | {r['final']:.4f} | {', '.join(mark)} |")
    L += ["", f"## Width {w}: equal steps and equal time (paired by seed: Dion2 0.25 minus Muon)", "",
          "| run | mu | lr | steps | final val loss (mean ± half range) | gap to Muon |", "|---|---|---|---|---|---|"]
    tuned = {}
    for name in p["mus"]:
        if wins[name]:
            mu, lr = wins[name]
            tuned[name] = [r for r in recs if r["width"] == w and r["name"] == name and r["mu"] == mu
                           and r["lr"] == lr and r["steps"] == N and r["phase"] != "timing"]
    if "muon" in tuned:
        L.append(f"| Muon | {wins['muon'][0]:g} | {wins['muon'][1]:g} | {N} | {fmt_final(tuned['muon'])} | — |")
    if "dion2-0.25" in tuned:
        mu, lr = wins["dion2-0.25"]
        L.append(f"| Dion2 0.25, equal steps | {mu:g} | {lr:g} | {N} | {fmt_final(tuned['dion2-0.25'])} | "
                 f"{fmt_gap(gap(tuned['dion2-0.25'], tuned.get('muon', [])))} |")
        et = [r for r in recs if r["phase"] == "time"]
        if et:
            L.append(f"| Dion2 0.25, equal time | {mu:g} | {lr:g} | {et[0]['steps']} | {fmt_final(et)} | "
                     f"{fmt_gap(gap(et, tuned.get('muon', [])))} |")
    ms = {n: [r["ms_per_step"] for r in rs if r.get("ms_per_step")] for n, rs in tuned.items()}
    if all(ms.get(n) for n in ("muon", "dion2-0.25")):
        L += ["", f"Median ms a step inside the 1000-step runs (two at a time, indicative): Muon "
              f"{statistics.median(ms['muon']):.0f}, Dion2 0.25 {statistics.median(ms['dion2-0.25']):.0f}."]
    L += ["", f"## Control at width {cw}: mu 0.8 with and without the error feedback", "",
          "| optimizer | lr (tuned at mu 0.95) | final, mu 0.95 | final, mu 0.8 | gap to Muon mu 0.95, mu 0.95 | "
          "gap to Muon mu 0.95, mu 0.8 | gap to Muon mu 0.8, mu 0.8 |", "|---|---|---|---|---|---|---|"]
    ctl = {}
    for name in p["control_optimizers"]:
        b = study.tuned_lr(cw, name, 0.95, p["control_lrs"])
        if b is None or not math.isfinite(b["final"]):
            continue
        ctl[name] = {mu: [r for r in recs if r["width"] == cw and r["name"] == name and r["mu"] == mu
                          and r["lr"] == b["lr"]] for mu in p["control_mus"]}
        ctl[name]["lr"] = b["lr"]
    for name, c in ctl.items():
        mu_base = ctl.get("muon", {})
        L.append(f"| {name} | {c['lr']:g} | {fmt_final(c[0.95])} | {fmt_final(c[0.8])} | "
                 f"{fmt_gap(gap(c[0.95], mu_base.get(0.95, []))) if name != 'muon' else '—'} | "
                 f"{fmt_gap(gap(c[0.8], mu_base.get(0.95, [])))} | "
                 f"{fmt_gap(gap(c[0.8], mu_base.get(0.8, []))) if name != 'muon' else '—'} |")
    sweep = sorted((r for r in recs if r["width"] == cw and r["seed"] == 0 and r["mu"] == 0.95),
                   key=lambda r: (r["name"], r["lr"]))
    L += ["", "Control lr sweeps (seed 0, mu 0.95): " +
          "; ".join(f"{r['name']} lr {r['lr']:g} {r['final']:.4f}" for r in sweep) + "."]
    bad = [r for r in recs if not math.isfinite(r["final"])]
    if bad:
        L += ["", "## Failed runs", ""] + [f"- {r['run']}: {r.get('error')}" for r in bad]
    missing = [run_name(*r[2:]) for r in study.all_runs() if run_name(*r[2:]) not in study.recs]
    if missing:
        L += ["", f"Not finished yet: {len(missing)} run(s) ({', '.join(sorted(missing)[:6])}"
              f"{', ...' if len(missing) > 6 else ''})."]
    L += ["", "![val loss against step and seconds, the winners, mean over seeds](best_vs_best.png)", ""]
    md = "\n".join(L)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    json.dump({"preset": preset, "params": p, "timing": study.timing, "equal_time_steps": study.equal_time_steps,
               "machine": {"cpu": model, "flags": flags}, "runs": sorted(recs, key=lambda r: r["run"])},
              open(os.path.join(out, "runs.json"), "w"), indent=1)
    plot(tuned, [r for r in recs if r["phase"] == "time"], study.timing, out)
    return md


def plot(tuned, equal_time, timing, out):
    """Val loss against step, and against seconds at the timed ms a step (alone, the equal-time
    budget's clock: the runs' own seconds depend on what ran beside them)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    series = [("Muon", "muon", tuned.get("muon", [])), ("Dion2 0.25", "dion2-0.25", tuned.get("dion2-0.25", [])),
              ("Dion2 0.25, equal time", "dion2-0.25", equal_time)]
    for label, name, rs in series:
        rs = [r for r in rs if r["val"]]
        if not rs:
            continue
        n = min(len(r["val"]) for r in rs)
        steps = [rs[0]["val"][i][0] for i in range(1, n)]
        loss = [statistics.fmean(r["val"][i][1] for r in rs) for i in range(1, n)]
        secs = [s * (timing or {}).get(name, 0) / 1000 for s in steps]
        axes[0].plot(steps, loss, label=label)
        axes[1].plot(secs, loss, label=label)
    for ax, x in zip(axes, ("step", "seconds at the timed ms a step (alone)")):
        ax.set_xlabel(x)
        ax.set_ylabel("val loss (nats a byte)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "best_vs_best.png"), dpi=100)
    plt.close(fig)


def main():
    ap = convergence.common_args(__doc__, "best_vs_best", "the 10-minute version (widths 128 and 64)",
                                 "plumbing only: tiny widths, a few steps")
    ap.add_argument("--report", action="store_true", help="write the report from the finished runs, train nothing")
    args = ap.parse_args()
    preset, out = convergence.settle_args(args, "best_vs_best")
    p = dict(PRESETS[preset], jobs=args.jobs, load_before=machine.loadavg())
    os.makedirs(out, exist_ok=True)
    print(f"[best] {preset}: width {p['width']} and control width {p['control_width']}, {p['num_iterations']} steps; "
          f"out {out}", file=sys.stderr)
    t0 = time.time()
    data = convergence.prepare_data(args.build, out)
    study = run_study(args.build, data, out, p, args.jobs, train_runs=not args.report)
    p["load_after"] = machine.loadavg()
    md = report(study, preset, out, time.time() - t0)
    print(md)
    print(f"[best] wrote {os.path.join(out, 'report.md')}, runs.json and best_vs_best.png", file=sys.stderr)
    convergence.publish(out, convergence.results_dir(args, preset, "best_vs_best"),
                        ["report.md", "runs.json", "best_vs_best.png", "timing.json"], "best")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"best_vs_best.py: error: {e}", file=sys.stderr)
        sys.exit(1)
