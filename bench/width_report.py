"""The width study's report (bench/width_study.py runs, this writes): OUT/report.md,
OUT/gap_vs_width.png and OUT/runs.json from the run records.

    report(p, preset, recs, out, seconds) -> the report's markdown

A run record: convergence.train_one's (name, lr, seed, phase, val, final, seconds, steps, error,
run_dir) with width and variant ("" for the study's schedule, "_n<steps>" for another length,
"_mu0.8") added by the study.

What it computes (docs/convergence.md "Width study"):
  - per width, the tuned lr (the lowest seed-0 final val loss of the grid) and the tuned runs:
    final val loss mean ± half range over seeds;
  - the gap to Muon, paired by seed (the same initial weights and data order): per seed the
    optimizer's final minus Muon's, then mean ± half range over the seeds both have;
  - the expectation: Dion2 0.25's gap shrinks from each width to the next;
  - steps to AdamW's final val loss from the shorter schedules: the fewest steps whose run (its
    own warmdown) ends, mean over seeds, at or below the mean of AdamW's final val losses at that
    width; seconds: those steps x the runs' median ms a step (dion-train's step lines, the first
    step left out, runs two at a time); bytes a step a rank at 8 and 64 ranks, FSDP, from
    scripts/cost_model.py (convergence.fsdp_bytes);
  - why: Dion2 0.25's paired gap to Muon at the study's steps, at mu 0.8, and at twice the steps
    (Muon at twice the steps too).
"""
import math
import os
import statistics

import convergence
import convergence_report


def step_ms(rec):
    """Median ms a step over the run's step lines, the first left out; None without a log."""
    log = os.path.join(rec["run_dir"], "train.log")
    if not os.path.isfile(log):
        return None
    ms = []
    with open(log) as f:
        for line in f:
            m = convergence.STEP_RE.search(line)
            if m:
                ms.append(float(m.group(1)))
    return statistics.median(ms[1:]) if len(ms) > 1 else None


def mean_hr(xs):
    """'mean ± half range' of a list of numbers."""
    return f"{statistics.fmean(xs):.4f} ± {(max(xs) - min(xs)) / 2:.4f}"


def ok(recs):
    return [r for r in recs if math.isfinite(r["final"])]


def tuned(recs, w, name):
    """(tuned lr, seed-0 sweep runs sorted by lr, tuned runs by seed) at width w."""
    sweep = sorted((r for r in recs if r["width"] == w and r["name"] == name and r["phase"] == "sweep"),
                   key=lambda r: r["lr"])
    good = ok(sweep)
    if not good:
        return None, sweep, {}
    lr = min(good, key=lambda r: r["final"])["lr"]
    runs = {r["seed"]: r for r in ok(recs) if r["width"] == w and r["name"] == name and r["lr"] == lr
            and r["variant"] == "" and r["phase"] in ("sweep", "seeds")}
    return lr, sweep, runs


def paired_gap(a, b):
    """(mean, half range, seeds) of a[s].final - b[s].final over the seeds both have; None if none."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    d = [a[s]["final"] - b[s]["final"] for s in seeds]
    return statistics.fmean(d), (max(d) - min(d)) / 2, len(seeds)


def fmt_gap(g, base=None):
    if g is None:
        return "—"
    s = f"{g[0]:+.4f} ± {g[1]:.4f}"
    return s + (f" ({100 * g[0] / base:+.1f}%)" if base else "")


def variant_runs(recs, w, name, variant):
    return {r["seed"]: r for r in ok(recs) if r["width"] == w and r["name"] == name and r["variant"] == variant}


def plot(table, out):
    """table: {name: [(width, final mean, final half range, gap or None)]} -> gap_vs_width.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, (name, rows) in enumerate(table.items()):
        if not rows:
            continue
        ws = [r[0] for r in rows]
        ax0.errorbar(ws, [r[1] for r in rows], yerr=[r[2] for r in rows], marker="o", capsize=3, color=f"C{i}",
                     label=name)
        g = [(r[0], r[3]) for r in rows if r[3] is not None]
        if name != "muon" and g:
            ax1.errorbar([x[0] for x in g], [x[1][0] for x in g], yerr=[x[1][1] for x in g], marker="o", capsize=3,
                         color=f"C{i}", label=name)
    for ax in (ax0, ax1):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("width (model_dim)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax0.set_ylabel("final val loss (nats / byte)")
    ax0.set_title("final val loss (mean over seeds ± half range)")
    ax1.axhline(0, color="k", lw=0.8)
    ax1.set_ylabel("final val loss - Muon's (same seed)")
    ax1.set_title("gap to Muon (paired by seed; mean ± half range)")
    return convergence_report._save(fig, out, "gap_vs_width.png")


def report(p, preset, recs, out, seconds):
    import machine
    model_cpu, flags = machine.cpu()
    N = p["num_iterations"]
    lines = [f"# Width study ({preset})", "",
             f"Machine: {model_cpu or 'unknown CPU'} ({', '.join(flags) or 'no flags read'}), {os.cpu_count()} cores; "
             f"load average before {p['load_before']}, after {p.get('load_after', '?')}; {seconds:.0f} s this "
             f"invocation (finished runs are reused); one thread a run, {p.get('jobs', 2)} runs at a time.", "",
             f"Model: byte-level GPT, {p['n_layer']} layers, heads of 64, T {p['sequence_length']}, batch "
             f"{p['batch_size']}, {N} steps ({N * p['batch_size'] * p['sequence_length']:,} tokens) at every width; "
             f"validation every {p['val_loss_every']} steps on {p['val_batches'] * p['batch_size'] * p['sequence_length']:,} "
             f"tokens; dion-train's schedule (warmup 1%, warmdown 20%), weight decay 0.01, fp32, ortho_path exact. "
             f"Seed s: initial weights and data order (data_seed s). The matrix optimizers' embedding and lm_head: "
             f"AdamW at AdamW's tuned lr of the width (embed_lr, lm_head_lr).", ""]
    widths = [w for w in p["widths"] if any(r["width"] == w for r in recs)]
    names = [n for n in p["optimizers"] if any(r["name"] == n for r in recs)]
    lines += ["## Per width", "",
              "| width | parameters (hidden %) | optimizer | lr grid, seed 0: final val loss (tuned in bold) | seeds | "
              "final val loss (mean ± half range) | gap to Muon, paired (% of Muon's) |",
              "|---|---|---|---|---|---|---|"]
    table = {n: [] for n in names}
    gaps = {}
    muon_means = {}
    for w in widths:
        hidden, emb, head = convergence.param_split(dict(p, model_dim=w))
        total = hidden + emb + head
        muon = tuned(recs, w, "muon")[2]
        muon_mean = statistics.fmean(r["final"] for r in muon.values()) if muon else None
        muon_means[w] = muon_mean
        for n in names:
            lr, sweep, runs = tuned(recs, w, n)
            cells = ", ".join((f"**{r['lr']:g}: {r['final']:.4f}**" if r["lr"] == lr else
                               f"{r['lr']:g}: " + (f"{r['final']:.4f}" if math.isfinite(r["final"]) else "failed"))
                              for r in sweep)
            if lr is not None and len(sweep) > 1 and lr in (sweep[0]["lr"], sweep[-1]["lr"]):
                cells += " (edge)"
            finals = [r["final"] for r in runs.values()]
            g = paired_gap(runs, muon) if n != "muon" else None
            gaps[(w, n)] = g
            if finals:
                table[n].append((w, statistics.fmean(finals), (max(finals) - min(finals)) / 2, g))
            lines.append(f"| {w} | {total:,} ({100 * hidden / total:.0f}%) | {n} | {cells or '—'} | {len(finals)} | "
                         f"{mean_hr(finals) if finals else '—'} | {fmt_gap(g, muon_mean) if n != 'muon' else '(Muon)'} |")
    lines += ["", "Gap to Muon: per seed, the optimizer's final val loss minus Muon's at the same seed (the same "
              "initial weights and data order), then the mean ± half range over the seeds both finished. (edge): "
              "the tuned lr is at the edge of its grid.", ""]
    d = [(w, gaps.get((w, "dion2-0.25"))) for w in widths if gaps.get((w, "dion2-0.25"))]
    if len(d) >= 2:
        steps = [(a, b) for a, b in zip(d, d[1:])]
        shrink = all(b[1][0] < a[1][0] for a, b in steps)
        clear = all(a[1][0] - b[1][0] > a[1][1] + b[1][1] for a, b in steps)
        lines += [f"**Expectation (Dion2 0.25's gap to Muon shrinks as width grows): "
                  f"{('held' if clear else 'held only weakly') if shrink else 'did not hold'}** — gap "
                  + " → ".join(f"{g[0]:+.4f} at {w}" for w, g in d)
                  + (f"; {'every' if clear else 'not every'} step down is larger than the two half ranges together"
                     if shrink else "")
                  + "; as a share of Muon's loss: "
                  + " → ".join(f"{100 * g[0] / muon_means[w]:.1f}%" for w, g in d if muon_means.get(w))
                  + ".", ""]
    sw = p["schedule_width"]
    adam = tuned(recs, sw, "adamw")[2]
    if adam and any(r["phase"] == "schedule" for r in recs):
        target = statistics.fmean(r["final"] for r in adam.values())
        adam_ms = [m for m in (step_ms(r) for r in adam.values()) if m]
        fr = [1.0] + sorted(p["schedule_fractions"], reverse=True)
        head = " | ".join(f"{f:g} N" for f in fr)
        lines += [f"## Steps and seconds to AdamW's final val loss (width {sw}, shorter schedules)", "",
                  f"AdamW's final val loss at width {sw}: {target:.4f} (mean of {len(adam)} seeds) in N = {N} steps"
                  + (f", {N * statistics.median(adam_ms) / 1000:.0f} s ({statistics.median(adam_ms):.0f} ms a step)."
                     if adam_ms else "."), "",
                  f"| optimizer | final val loss at {head} | fewest steps to AdamW's final | x N | seconds (ms a step) | "
                  "bytes / step / rank, 8 ranks FSDP | 64 ranks |", "|---|" + "---|" * (len(fr) + 5)]
        for n in ["adamw"] + p["schedule_optimizers"]:
            runs = {1.0: tuned(recs, sw, n)[2]}
            for f in p["schedule_fractions"]:
                runs[f] = variant_runs(recs, sw, n, f"_n{max(1, round(N * f))}") if n != "adamw" else {}
            cells, best = [], None
            for f in fr:
                rs = runs[f]
                cells.append(mean_hr([r["final"] for r in rs.values()]) if rs else "—")
                if rs and statistics.fmean(r["final"] for r in rs.values()) <= target:
                    best = f  # fr runs from the longest to the shortest
            ms = [m for rs in runs.values() for m in (step_ms(r) for r in rs.values()) if m]
            msm = statistics.median(ms) if ms else None
            st = round(N * best) if best else None
            secs = f"{st * msm / 1000:.0f} ({msm:.0f})" if st and msm else "—"
            q = dict(p, model_dim=sw)
            lines.append(f"| {n} | " + " | ".join(cells) + f" | {st if st else 'not reached'} | "
                         f"{f'{best:g}' if best else '—'} | {secs} | "
                         f"{convergence_report.fmt_bytes(convergence.fsdp_bytes(q, n, 8))} | "
                         f"{convergence_report.fmt_bytes(convergence.fsdp_bytes(q, n, 64))} |")
        lines += ["", "Each shorter run has its own schedule (warmup and warmdown as fractions of its own steps), "
                  "not a point on the full-length curve. Fewest steps: the shortest schedule whose final val loss, "
                  "mean over seeds, is at or below AdamW's (AdamW's row: its N steps). Seconds: those steps x the "
                  "median ms a step of the optimizer's runs (two runs at a time on two cores). Bytes: the "
                  "optimizer's own traffic in scripts/cost_model.py (FSDP over all ranks, bf16); AdamW: none; "
                  "the weight gathers and gradient reduce-scatters, the same for every optimizer, left out.", ""]
    why = [r for r in recs if r["phase"] == "why"]
    if why:
        base_m = tuned(recs, sw, "muon")[2]
        base_d = tuned(recs, sw, "dion2-0.25")[2]
        rows = [("the study's schedule", N, paired_gap(base_d, base_m)),
                ("mu 0.8 (error feedback settles 4x sooner)", N,
                 paired_gap(variant_runs(recs, sw, "dion2-0.25", "_mu0.8"), base_m)),
                ("twice the steps (Muon too)", 2 * N,
                 paired_gap(variant_runs(recs, sw, "dion2-0.25", f"_n{2 * N}"),
                            variant_runs(recs, sw, "muon", f"_n{2 * N}")))]
        lines += [f"## Why: Dion2 0.25's gap to Muon at width {sw}", "",
                  "| Dion2 0.25 run | steps | gap to Muon, paired (mean ± half range, seeds) |", "|---|---|---|"]
        lines += [f"| {what} | {n} | {fmt_gap(g)}{f' ({g[2]})' if g else ''} |" for what, n, g in rows]
        lines.append("")
    failed = [r for r in recs if r.get("error")]
    if failed:
        lines += ["## Failed runs", ""] + [f"- width {r['width']} {r['name']} lr {r['lr']:g} seed {r['seed']}"
                                           f"{r['variant']}: {r['error']}" for r in failed] + [""]
    png = plot(table, out)
    lines.append(f"![gap vs width]({os.path.basename(png)})\n")
    return convergence_report.write(out, lines, preset, p, recs)
