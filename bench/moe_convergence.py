#!/usr/bin/env python3
"""The convergence benchmark's MoE row: a mixture-of-experts GPT against the dense GPT of the
same active parameters, trained the same way, under AdamW, Muon and Dion2.

    python3 bench/moe_convergence.py [--smoke] [--out DIR] [--build DIR] [--jobs N] [--seeds S] [--results DIR]
    bench/convergence.sh --moe ...   (the same, building dion-train and dion-data first)

What it runs (docs/convergence.md "Mixture of experts"): the width study's model at width 128
(bench/width_study.py's full preset: byte-level, 2 layers, T 128, batch 16, 1000 steps), dense
(MLP of 4 x 128 = 512 hidden) and MoE (8 experts of 170 hidden, top_k 2, one shared expert: 3 x
170 = 510 hidden a token, so about the dense model's active parameters; router_opt matrix for the
matrix optimizers, balance loss 0.01 and bias rate 0.001, as configs/shakespeare_bytes_moe.yaml),
each optimizer at the learning rates the width study tuned on the dense model at this width
(matrices; the embedding and lm_head at AdamW's), seeds 0 .. S-1 moving the weights and the data
order. The same out folder as the width study (default runs/width) reuses its dense runs.
Writes OUT/moe_report.md and OUT/moe_runs.json (every run's record: val curve, final, seconds);
the full preset copies both into bench/results/moe (--results), where they are committed.
Resumable like the study (finished runs are reused).
"""
import json
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import convergence  # noqa: E402
import machine  # noqa: E402
import width_study  # noqa: E402

BenchError = convergence.BenchError

# The width study's tuned lrs at width 128 (docs/convergence.md, 2026-12-05): matrices, and the
# embedding and lm_head at AdamW's.
LRS = {"adamw": 0.002, "muon": 0.01, "dion2-0.5": 0.01}
ADAMW_LR = LRS["adamw"]
MOE = dict(n_experts=8, top_k=2, n_shared_experts=1, expert_dim=170, moe_aux_loss_coef=0.01, moe_bias_rate=0.001)
PRESETS = {
    "full": dict(width_study.PRESETS["full"], model_dim=128, n_head=2, seeds=3),
    "smoke": dict(width_study.PRESETS["smoke"], model_dim=32, n_head=1, seeds=2),
}


def runs(p, seeds):
    """(model, optimizer, lr, seed, run name, dion-train keys) of every run."""
    out = []
    w = p["model_dim"]
    moe = dict(MOE, expert_dim=max(1, MOE["expert_dim"] * w // 128))
    for name, lr in LRS.items():
        for s in range(seeds):
            keys = dict(width_study.OPTIMIZER_KEYS[name], data_seed=s)
            if name != "adamw":
                keys.update(embed_lr=ADAMW_LR, lm_head_lr=ADAMW_LR)
            out.append(("dense", name, lr, s, width_study.Study.run_name(w, name, lr, s), keys))
            mk = dict(keys, **moe)
            if name != "adamw":
                mk["router_opt"] = "matrix"
            out.append(("moe", name, lr, s, width_study.Study.run_name(w, "moe_" + name, lr, s), mk))
    return out


def banner_counts(rec):
    """(total, active) parameters from the run's banner line in train.log; None when absent."""
    try:
        with open(os.path.join(rec["run_dir"], "train.log")) as f:
            for line in f:
                m = re.search(r"GPT .*?, (\d+) parameters(?: \((\d+) active)?", line)
                if m:
                    return int(m.group(1)), int(m.group(2) or m.group(1))
    except OSError:
        pass
    return None


def report(p, recs, out, seconds, load_before):
    def mean_hr(xs):
        return f"{statistics.fmean(xs):.4f} ± {(max(xs) - min(xs)) / 2:.4f}"

    def counts(model):
        for r in recs:
            if r["model"] == model and banner_counts(r):
                return banner_counts(r)
        return (0, 0)

    def ms_a_step(r):
        return 1000 * r["seconds"] / r["steps"]

    total_d, _ = counts("dense")
    total_m, active_m = counts("moe")
    lines = ["# Mixture of experts vs dense, the same active parameters", "",
             f"Machine: {convergence_machine()}; load average before {load_before}, after "
             f"{machine.loadavg()}; {seconds:.0f} s this invocation (finished runs "
             "are reused); one thread a run", "",
             f"Model: byte-level GPT, {p['n_layer']} layers x {p['model_dim']}, T {p['sequence_length']}, batch "
             f"{p['batch_size']}, {p['num_iterations']} steps. Dense: {total_d:,} parameters. MoE: {total_m:,} "
             f"parameters, {active_m:,} active ({MOE['n_experts']} experts, top_k {MOE['top_k']}, "
             f"{MOE['n_shared_experts']} shared).", "",
             "| optimizer | lr | seeds | dense final val loss | MoE final val loss | MoE - dense, paired | "
             "dense ms a step | MoE ms a step |", "|---|---|---|---|---|---|---|---|"]
    failed = [r for r in recs if r.get("error")]
    for name, lr in LRS.items():
        d = {r["seed"]: r for r in recs if r["model"] == "dense" and r["name"] == name and not r.get("error")}
        m = {r["seed"]: r for r in recs if r["model"] == "moe" and r["name"] == name and not r.get("error")}
        both = sorted(set(d) & set(m))
        if not both:
            lines.append(f"| {name} | {lr:g} | 0 | — | — | — | — | — |")
            continue
        diff = [m[s]["final"] - d[s]["final"] for s in both]
        lines.append(f"| {name} | {lr:g} | {len(both)} | {mean_hr([d[s]['final'] for s in both])} | "
                     f"{mean_hr([m[s]['final'] for s in both])} | {statistics.fmean(diff):+.4f} ± "
                     f"{(max(diff) - min(diff)) / 2:.4f} | "
                     f"{statistics.median(ms_a_step(d[s]) for s in both):.0f} | "
                     f"{statistics.median(ms_a_step(m[s]) for s in both):.0f} |")
    lines += ["", "Paired: per seed (the same initial dense weights' seed and data order), MoE minus dense, then "
              "mean ± half range. ms a step: wall time of the run / its steps (validation included), two runs "
              "at a time."]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- {r['run_dir']}: {r['error']}" for r in failed]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(out, "moe_report.md"), "w") as f:
        f.write(md)
    return md


def convergence_machine():
    model, flags = machine.cpu()
    return f"{model} ({', '.join(flags)}), {os.cpu_count()} cores"


def main():
    ap = convergence.common_args(__doc__, "width", "(no quick form: use --smoke or --seeds 1)",
                                 "plumbing only: tiny widths, a few steps")
    ap.add_argument("--seeds", type=int, default=None, help="seeds a run (default: the preset's)")
    args = ap.parse_args()
    if args.quick:
        raise BenchError("moe_convergence.py has no --quick; use --seeds 1 for a shorter run")
    preset, out = convergence.settle_args(args, "width")
    p = PRESETS[preset]
    seeds = args.seeds or p["seeds"]
    os.makedirs(out, exist_ok=True)
    load_before = machine.loadavg()
    t0 = time.time()
    data = convergence.prepare_data(args.build, out)
    todo = runs(p, seeds)
    print(f"[moe] {preset}: {len(todo)} runs (dense runs of the width study in {out} are reused)", file=sys.stderr)
    jobs = [("moe", name, lr, s, "exact", keys, run_name) for _, name, lr, s, run_name, keys in todo]
    recs = [dict(r, model=model) for r, (model, *_) in zip(convergence.run_all(args.build, data, out, p, jobs, args.jobs),
                                                             todo)]
    print(report(p, recs, out, time.time() - t0, load_before))
    with open(os.path.join(out, "moe_runs.json"), "w") as f:
        json.dump({"preset": preset, "params": p, "runs": recs}, f, indent=1, default=str)
    print(f"[moe] wrote {os.path.join(out, 'moe_report.md')} and moe_runs.json", file=sys.stderr)
    convergence.publish(out, convergence.results_dir(args, preset, "moe"), ["moe_report.md", "moe_runs.json"], "moe")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"moe_convergence.py: error: {e}", file=sys.stderr)
        sys.exit(1)
