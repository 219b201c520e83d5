"""The convergence benchmark's report (bench/convergence.py runs, this writes): OUT/report.md,
the PNGs and OUT/runs.json from the run records.

    report(p, preset, recs, out, seconds) -> the report's markdown

A run record (convergence.train_one): name, lr, seed, path ("exact" | "fast"), phase ("sweep",
"extension", "seeds", "fast"), val [(step, loss, time_s)], final, seconds, opt_share, error.

What it computes (docs/convergence.md "What it writes"):
  - the tuned lr: the lowest final val loss of seed 0 over the sweep and its extension (exact);
  - mean curves: the mean over seeds at the validation steps every run has;
  - steps / seconds to AdamW's final: the first validation of the mean curve at or below the mean
    of AdamW's final val losses; over the run's steps N (AdamW's steps to its final);
  - fast vs exact (the optimizers run both ways): final val loss mean +- half range per path, the
    largest |difference| of the two mean curves, and whether they agree within the seed spread:
    at every validation |mean fast - mean exact| <= the larger of the two paths' half ranges
    over seeds there.
Plots: val_loss_vs_step.png, val_loss_vs_time.png (every optimizer's tuned exact curve) and
val_loss_fast_vs_exact.png (each path's mean curve with its seeds' range shaded).
"""
import json
import math
import os
import statistics


def mean_curve(recs):
    """[(step, mean loss, mean time_s, half range of the loss)] over the runs' common validation steps."""
    steps = None
    for r in recs:
        s = {v[0] for v in r["val"]}
        steps = s if steps is None else steps & s
    out = []
    for st in sorted(steps or []):
        ls = [next(v for v in r["val"] if v[0] == st) for r in recs]
        losses = [v[1] for v in ls]
        out.append((st, statistics.fmean(losses), statistics.fmean(v[2] for v in ls),
                    (max(losses) - min(losses)) / 2))
    return out


def first_reach(curve, target):
    for st, loss, t, _ in curve:
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


def fast_vs_exact(exact, fast):
    """(largest |difference| of the mean curves, its step, agree within the seed spread, the
    largest |difference| / spread) of two lists of runs with the same seeds."""
    ce = {c[0]: c for c in mean_curve(exact)}
    cf = {c[0]: c for c in mean_curve(fast)}
    worst, worst_step, agree, worst_ratio = 0.0, None, True, 0.0
    for st in sorted(set(ce) & set(cf)):
        d = abs(ce[st][1] - cf[st][1])
        spread = max(ce[st][3], cf[st][3])
        if d > worst:
            worst, worst_step = d, st
        if d > spread:
            agree = False
        if spread > 0:
            worst_ratio = max(worst_ratio, d / spread)
        elif d > 0:
            worst_ratio = math.inf
    return worst, worst_step, agree, worst_ratio


def _save(fig, out, name):
    import matplotlib.pyplot as plt
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)
    return path


def _ylim(ax, curves):
    later = [c[1] for curve in curves for c in curve[1:] if math.isfinite(c[1])]
    if later:  # the step-0 loss (about ln 320) would flatten every difference that matters
        lo, hi = min(later), max(later)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.05 * (hi - lo + 1e-9))


def plot(curves, out, xkey):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, curve in curves.items():
        if not curve:
            continue
        xs = [c[0] for c in curve] if xkey == "step" else [c[2] for c in curve]
        ax.plot(xs, [c[1] for c in curve], marker="o", markersize=2, label=name)
    _ylim(ax, curves.values())
    ax.set_xlabel("step" if xkey == "step" else "wall time (s)")
    ax.set_ylabel("val loss (nats / byte)")
    ax.set_title(f"byte-level Tiny Shakespeare: val loss vs {'step' if xkey == 'step' else 'wall time'}")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out, f"val_loss_vs_{'step' if xkey == 'step' else 'time'}.png")


def plot_paths(pairs, out):
    """pairs: {name: (exact runs, fast runs)} -> val_loss_fast_vs_exact.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    curves = []
    for i, (name, (exact, fast)) in enumerate(pairs.items()):
        for path, rs, style in (("exact", exact, "-"), ("fast", fast, "--")):
            c = mean_curve(rs)
            if not c:
                continue
            curves.append(c)
            xs = [x[0] for x in c]
            ax.plot(xs, [x[1] for x in c], style, color=f"C{i}", label=f"{name} {path} ({len(rs)} seeds)")
            ax.fill_between(xs, [x[1] - x[3] for x in c], [x[1] + x[3] for x in c], color=f"C{i}", alpha=0.15)
    _ylim(ax, curves)
    ax.set_xlabel("step")
    ax.set_ylabel("val loss (nats / byte)")
    ax.set_title("fast vs exact orthogonalizer (mean over seeds, seeds' range shaded)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out, "val_loss_fast_vs_exact.png")


def tuned_lrs(recs):
    """{name: (tuned lr, [seed-0 exact runs by lr], at the edge of what was run)}."""
    by_name = {}
    for r in recs:
        if r["phase"] in ("sweep", "extension"):
            by_name.setdefault(r["name"], []).append(r)
    out = {}
    for name, rs in by_name.items():
        rs = sorted(rs, key=lambda r: r["lr"])
        ok = [r for r in rs if math.isfinite(r["final"])]
        lr = min(ok, key=lambda r: r["final"])["lr"] if ok else None
        edge = lr is not None and len(rs) > 1 and lr in (rs[0]["lr"], rs[-1]["lr"])
        out[name] = (lr, rs, edge)
    return out


def report(p, preset, recs, out, seconds, fsdp_bytes, param_split, vocab):
    import machine
    hidden, emb, head = param_split(p)
    total = hidden + emb + head
    lines = [f"# Convergence benchmark ({preset})", ""]
    model_cpu, flags = machine.cpu()
    lines += [f"Machine: {model_cpu or 'unknown CPU'} ({', '.join(flags) or 'no flags read'}), {os.cpu_count()} cores; "
              f"load average before {p['load_before']}, after {p.get('load_after', '?')}; {seconds:.0f} s this "
              f"invocation (runs that had finished are reused).", ""]
    lines += [f"Model: {p['n_layer']} layers x {p['model_dim']} wide, {p['n_head']} heads, T {p['sequence_length']}, "
              f"vocab_size {vocab} (bytes); batch {p['batch_size']} sequences, {p['num_iterations']} steps, "
              f"validation every {p['val_loss_every']} steps on {p['val_batches'] * p['batch_size'] * p['sequence_length']} "
              f"tokens. Parameters: {total:,} = hidden matrices {hidden:,} ({100 * hidden / total:.1f}%) + "
              f"embedding {emb:,} + lm_head {head:,}. Schedule: dion-train's defaults for every optimizer (warmup "
              f"1%, linear warmdown over the last 20%, weight decay 0.01), scalar_opt adamw, fp32, ortho_path exact "
              f"unless a row says fast, one thread a run, {p.get('jobs', 2)} runs at a time.", ""]
    tuned = tuned_lrs(recs)
    lines += ["## Sweep (seed 0, final val loss)", "", "| optimizer | lr: final val loss (best in bold; + an "
              "extension beyond the grid's edge) |", "|---|---|"]
    for name, (lr, rs, _) in tuned.items():
        cells = []
        for r in rs:
            c = f"{r['lr']:g}: " + (f"{r['final']:.4f}" if math.isfinite(r["final"]) else "failed")
            c = f"**{c}**" if r["lr"] == lr else c
            cells.append(("+ " if r["phase"] == "extension" else "") + c)
        lines.append(f"| {name} | " + ", ".join(cells) + " |")
    lines.append("")
    ext = sorted({r["name"] for r in recs if r["phase"] == "extension"})
    if ext:
        lines += [f"The sweep's best lr was at the edge of its grid for {', '.join(ext)}: one more lr beyond that "
                  f"edge was run (marked +).", ""]
    edge = [n for n, (_, _, e) in tuned.items() if e]
    if edge:
        lines += [f"The best lr is still at the edge of what was run for {', '.join(edge)}: a wider sweep may find "
                  f"a better one.", ""]
    runs = {name: [r for r in recs if r["name"] == name and r["lr"] == lr and r["path"] == "exact"
                   and r["phase"] != "fast" and math.isfinite(r["final"])]
            for name, (lr, _, _) in tuned.items() if lr is not None}
    curves = {name: mean_curve(rs) for name, rs in runs.items()}
    adam = curves.get("adamw")
    adam_final = statistics.fmean(r["final"] for r in runs["adamw"]) if runs.get("adamw") else None
    adam_steps = p["num_iterations"]  # AdamW reaches its final val loss in the run's steps
    lines += ["## Tuned", "",
              "| optimizer | tuned lr | seeds | final val loss (mean ± half range) | steps to AdamW's final | "
              "x AdamW's steps (N) | seconds to AdamW's final | optimizer share of step | optimizer bytes / step / rank, "
              "8 ranks FSDP |", "|---|---|---|---|---|---|---|---|---|"]
    for name, (lr, _, _) in tuned.items():
        rs = runs.get(name, [])
        if not rs:
            lines.append(f"| {name} | — | 0 | every run failed | | | | | |")
            continue
        finals = [r["final"] for r in rs]
        spread = (max(finals) - min(finals)) / 2
        st, secs = first_reach(curves[name], adam_final) if adam_final is not None else (None, None)
        ratio = f"{st / adam_steps:.2f}" if st else "—"
        shares = [r["opt_share"] for r in rs if r["opt_share"] is not None]
        share = f"{100 * statistics.fmean(shares):.0f}%" if shares else "—"
        lines.append(f"| {name} | {lr:g} | {len(rs)} | {statistics.fmean(finals):.4f} ± {spread:.4f} | "
                     f"{st if st else 'not reached'} | {ratio} | {f'{secs:.0f}' if secs else '—'} | {share} | "
                     f"{fmt_bytes(fsdp_bytes(p, name))} |")
    lines += ["", "Steps and seconds to AdamW's final: the first validation of the optimizer's mean curve (over its "
              "seeds) at or below the mean of AdamW's final val losses; x AdamW's steps: that step over the run's "
              f"{p['num_iterations']} steps, which AdamW takes to reach it (AdamW's own row: where its mean curve "
              "first gets there, the flat end of the warmdown). Optimizer share: optimizer ms / step ms "
              "summed over the step lines (time_optimizer), the first step left out. Bytes: scripts/cost_model.py "
              "(FSDP, fs 8, bf16 orthogonalizer traffic, legacy Dion's fp32 P and R); NorMuon counted as Muon, "
              "Dion3/NorDion2 as Dion2; the FSDP weight gathers and gradient reduce-scatters, the same for every "
              "optimizer, are left out.", ""]
    pairs = {}
    for name in p.get("fast", []):
        if name not in runs or not runs[name]:
            continue
        fast = [r for r in recs if r["name"] == name and r["phase"] == "fast" and math.isfinite(r["final"])]
        seeds = {r["seed"] for r in fast}
        exact = [r for r in runs[name] if r["seed"] in seeds]
        if fast and exact:
            pairs[name] = (exact, fast)
    if pairs:
        lines += ["## Fast vs exact orthogonalizer", "",
                  "| optimizer | lr | seeds | final val loss, exact | final val loss, fast | largest \\|difference\\| "
                  "of the mean curves (at step) | agree within the seed spread | optimizer share exact / fast |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, (exact, fast) in pairs.items():
            cells = []
            for rs in (exact, fast):
                f = [r["final"] for r in rs]
                cells.append(f"{statistics.fmean(f):.4f} ± {(max(f) - min(f)) / 2:.4f}")
            worst, at, agree, ratio = fast_vs_exact(exact, fast)
            shares = []
            for rs in (exact, fast):
                s = [r["opt_share"] for r in rs if r["opt_share"] is not None]
                shares.append(f"{100 * statistics.fmean(s):.0f}%" if s else "—")
            lines.append(f"| {name} | {tuned[name][0]:g} | {len(fast)} | {cells[0]} | {cells[1]} | {worst:.4f} "
                         f"({at}) | {'yes' if agree else 'no'} (largest \\|difference\\| / spread {ratio:.2f}) | "
                         f"{' / '.join(shares)} |")
        lines += ["", "Agree within the seed spread: at every validation, |mean fast - mean exact| is at most the "
                  "larger of the two paths' half ranges over seeds there. The same seeds run both ways.", ""]
    failed = [r for r in recs if r.get("error")]
    if failed:
        lines += ["## Failed runs", ""] + [f"- {r['name']} lr {r['lr']:g} seed {r['seed']} ({r['path']}): {r['error']}"
                                           for r in failed] + [""]
    pngs = [plot(curves, out, "step"), plot(curves, out, "time")]
    if pairs:
        pngs.append(plot_paths(pairs, out))
    lines += [f"![{os.path.basename(x)[:-4].replace('_', ' ')}]({os.path.basename(x)})\n" for x in pngs]
    return write(out, lines, preset, p, recs)


def write(out, lines, preset, p, recs):
    """OUT/report.md from the lines, OUT/runs.json from the records; returns the markdown."""
    md = "\n".join(lines)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "runs.json"), "w") as f:
        json.dump({"preset": preset, "params": p, "runs": recs}, f, indent=1, default=str)
    return md
